"""The fetch ownership record ``.staged.json``: which files in a staging directory this tool wrote.

Fetch writes it with ``complete: false`` before the first download, listing every file it is about to
own (the whole inventory, claimed up front); ``complete: true`` is written last, after every file
matched the declaration and the local manifest is in place. Cleanup only ever deletes files listed
here::

    stage/iter_0000300/
    ├── model.pt
    └── .staged.json   this record

    {
      "complete": true,
      "declaration_sha256": "<hex of the remote .posttrain-archive.json bytes, or null>",
      "files": [{"path": "model.pt", "sha256": "<hex>", "size": 1234}],
      "protocol": "ckptflow.staged.v1",
      "source_uri": "s3://bucket/run1/checkpoint_artifacts/iter_0000300"
    }
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..jsonio import decode_json_object
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", sorted_entries(self.files))

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
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "source_uri": self.source_uri,
            "declaration_sha256": self.declaration_sha256,
            "files": inventory_to_list(self.files),
            "complete": self.complete,
        }


def path_in(directory: Path | str) -> Path:
    return Path(directory) / FILENAME


def parse_staging(data: bytes, *, what: str = FILENAME) -> StagingRecord:
    return StagingRecord.from_dict(decode_json_object(data, what=what), what=what)


def read_staging(source: Path | str) -> StagingRecord:
    return _record.read_record(KIND, source, parse_staging)


def encode_staging(record: StagingRecord) -> bytes:
    return _record.encode_record(record, what=FILENAME)


def write_staging(directory: Path | str, record: StagingRecord) -> Path:
    return _record.write_record(KIND, path_in(directory), record)
