"""The archive declaration ``.posttrain-archive.json``: the immutable, digest-bound list of what was archived.

Created once under the remote prefix before any payload is uploaded; its digest is what a receipt
and a staging record bind to::

    <prefix>/iter_0000300/
    ├── .posttrain-archive.json              this record (create-once)
    ├── .posttrain-checkpoint-artifact.json  the manifest, listed in "files" too
    └── model.pt ...

    {
      "files": [
        {"path": ".posttrain-checkpoint-artifact.json", "sha256": "<manifest_sha256>", "size": 512},
        {"path": "model.pt", "sha256": "<hex>", "size": 1234}
      ],
      "iteration": 300,
      "manifest_sha256": "<hex>",
      "protocol": "posttrain.artifact-archive.v1"
    }

"files" is sorted by path and must list the manifest with the digest ``manifest_sha256``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..digest import sha256_bytes
from ..errors import InvalidRecord
from . import _record
from .inventory import FileEntry, inventory_from_list, inventory_to_list, sorted_entries
from .manifest import FILENAME as MANIFEST_FILENAME

FILENAME = ".posttrain-archive.json"
PROTOCOL = "posttrain.artifact-archive.v1"

KIND = _record.RecordKind(filename=FILENAME, schema="declaration", protocol=PROTOCOL)


@dataclass(frozen=True, slots=True)
class Declaration:
    manifest_sha256: str
    iteration: int
    files: tuple[FileEntry, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", sorted_entries(self.files))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> Declaration:
        _record.check_object(KIND, data, what)
        record = cls(
            manifest_sha256=_record.require_sha256(data["manifest_sha256"], what, "manifest_sha256"),
            iteration=_record.require_size(data["iteration"], what, "iteration"),
            files=inventory_from_list(data["files"], what),
        )
        listed = {e.path: e for e in record.files}.get(MANIFEST_FILENAME)
        if listed is None:
            raise InvalidRecord(
                f"{what} does not list the manifest {MANIFEST_FILENAME}", remedy="the declaration is corrupt"
            )
        if listed.sha256 != record.manifest_sha256:
            raise InvalidRecord(
                f"{what} lists {MANIFEST_FILENAME} with sha256 {listed.sha256} but manifest_sha256 is "
                f"{record.manifest_sha256}",
                remedy="the declaration is corrupt",
            )
        return record

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "manifest_sha256": self.manifest_sha256,
            "iteration": self.iteration,
            "files": inventory_to_list(self.files),
        }


_FILE = _record.RecordFile(KIND, Declaration, parse_what=f"remote {FILENAME}")
path_in = KIND.path_in
parse_declaration = _FILE.parse
read_declaration = _FILE.read
encode_declaration = _FILE.encode
write_declaration = _FILE.write


def declaration_digest(record: Declaration) -> str:
    """The identity receipts and staging records bind to: SHA-256 of the encoded bytes.

    Equal to the digest of the remote object because the publisher uploads ``encode_declaration``'s
    bytes; for a declaration read from elsewhere, hash the bytes as fetched instead.
    """
    return sha256_bytes(encode_declaration(record))
