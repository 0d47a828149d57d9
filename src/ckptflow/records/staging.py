"""The fetch ownership record ``.staged.json``: which files in a staging directory this tool wrote.

Fetch writes it with ``complete: false`` before the first download, listing every file it is about to
own (the whole inventory, claimed up front); ``complete: true`` is written last, after every file
matched the declaration and the local manifest is in place. Cleanup only ever deletes files listed
here. A copy of named components only (``fetch --only model``: what a teacher build reads) records them
in ``components``; ``files`` are then those components' files and the manifest, and ``complete`` vouches
for those alone. A record without ``components`` (every record written before subsets existed) is a
copy of the whole artifact::

    stage/iter_0000300/
    ├── model.pt
    └── .staged.json   this record

    {
      "complete": true,
      "components": ["model"],       (absent: the whole artifact)
      "declaration_sha256": "<hex of the remote .posttrain-archive.json bytes, or null>",
      "files": [{"path": "model.pt", "sha256": "<hex>", "size": 1234}],
      "protocol": "ckptflow.staged.v1",
      "source_uri": "s3://bucket/run1/checkpoint_artifacts/iter_0000300"
    }
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRecord
from . import _record
from .inventory import FileEntry, inventory_from_list, inventory_to_list, sorted_entries

FILENAME = ".staged.json"
PROTOCOL = "ckptflow.staged.v1"

KIND = _record.RecordKind(
    filename=FILENAME, schema="staging", protocol=PROTOCOL, precheck=_record.check_source_uri
)


@dataclass(frozen=True, slots=True)
class StagingRecord:
    source_uri: str
    declaration_sha256: str | None
    files: tuple[FileEntry, ...]
    complete: bool
    components: tuple[str, ...] | None = None  # None: the whole artifact; else the components staged

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", sorted_entries(self.files))
        if self.components is not None:
            object.__setattr__(self, "components", tuple(sorted(set(self.components))))

    @property
    def whole(self) -> bool:
        return self.components is None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> StagingRecord:
        _record.check_object(KIND, data, what)
        return cls(
            source_uri=data["source_uri"],
            declaration_sha256=_record.optional_sha256(
                data["declaration_sha256"], what, "declaration_sha256"
            ),
            files=inventory_from_list(data["files"], what),
            complete=data["complete"],
            components=_components(data.get("components"), what),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "source_uri": self.source_uri,
            "declaration_sha256": self.declaration_sha256,
            "files": inventory_to_list(self.files),
            "complete": self.complete,
            # Written only for a subset: a whole copy's record stays readable by every earlier version.
            **({"components": list(self.components)} if self.components is not None else {}),
        }


def _components(value: Any, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if list(value) != sorted(set(value)):
        raise InvalidRecord(f"{what}: components {value!r} are not sorted and unique",
                            remedy="the record was not written by ckptflow; move the directory aside")
    return tuple(value)


_FILE = _record.RecordFile(KIND, StagingRecord)
path_in = KIND.path_in
parse_staging = _FILE.parse
read_staging = _FILE.read
encode_staging = _FILE.encode
write_staging = _FILE.write
