"""The part digests ``.posttrain-part-digests.json``: the BLAKE3 of every fixed-size part of the archived
files, so a read checks each part as it arrives, on any core, instead of one SHA-256 chain per file::

    <prefix>/iter_0000300/
    ├── .posttrain-archive.json              the declaration: lists this record with its size and sha256
    ├── .posttrain-part-digests.json         this record (written once, before any payload)
    ├── .posttrain-checkpoint-artifact.json  the manifest
    └── model.pt                             20 MiB: three parts of 8 MiB, 8 MiB and 4 MiB

    {
      "algorithm": "blake3",
      "files": [
        {"part_size": 8388608, "parts": ["<blake3 of bytes 0-8388607>", "<8388608-16777215>", "<16777216-20971519>"],
         "path": "model.pt", "sha256": "<the declaration's sha256 of model.pt>", "size": 20971520}
      ],
      "protocol": "ckptflow.part-digests.v1"
    }

The publisher takes the parts in the same read that hashes each file's SHA-256, writes this record into
the artifact directory beside the manifest, and lists it in the declaration like any archived file, so
the declaration's digest binds it: a reader that knows only the v1 declaration sees one more small
archived file and verifies everything by SHA-256 as before. Every entry repeats the declaration's size
and sha256 of its file, and a record that disagrees with the declaration is refused (``check_bound``)
when it is written and when it is read. The whole-file SHA-256 stays each file's identity; a reader
that checks every part of a file against a bound record has checked the bytes the SHA-256 names.

A file is covered when the publishing pass read it; the manifest (committed last) and this record are
never covered. Part size: ``digest.part_digest_size`` (8 MiB, one download range, grown so that a file
has at most 10,000 parts), the same for every destination.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..digest import FileDigest, PartDigests
from ..errors import InvalidRecord
from . import _record
from .inventory import FileEntry, validate_inventory
from .manifest import FILENAME as MANIFEST_FILENAME

FILENAME = ".posttrain-part-digests.json"
PROTOCOL = "ckptflow.part-digests.v1"
ALGORITHM = "blake3"

KIND = _record.RecordKind(filename=FILENAME, schema="part_digests", protocol=PROTOCOL)


@dataclass(frozen=True, slots=True)
class PartDigestRecord:
    files: tuple[tuple[str, PartDigests], ...]  # (path, parts), sorted by path

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", tuple(sorted(self.files, key=lambda item: item[0])))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> PartDigestRecord:
        _record.check_object(KIND, data, what)
        validate_inventory([FileEntry(f["path"], f["size"], f["sha256"]) for f in data["files"]], what)
        files = []
        for item in data["files"]:
            path = item["path"]
            if path in (FILENAME, MANIFEST_FILENAME):
                raise InvalidRecord(f"{what} lists {path}, which never has part digests",
                                    remedy="the record is corrupt; publish the artifact again to a new destination")
            try:
                parts = PartDigests(item["size"], item["sha256"], item["part_size"],
                                    tuple(bytes.fromhex(p) for p in item["parts"]))
            except ValueError as exc:
                raise InvalidRecord(f"{what}: {path}: {exc}", remedy="the record is corrupt") from None
            files.append((path, parts))
        return cls(tuple(files))

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "algorithm": ALGORITHM,
            "files": [{"path": path, "size": p.size, "sha256": p.sha256, "part_size": p.part_size,
                       "parts": [d.hex() for d in p.digests]} for path, p in self.files],
        }

    def by_path(self) -> dict[str, PartDigests]:
        return dict(self.files)

    def check_bound(self, declared: Iterable[FileEntry], what: str) -> None:
        """Refuse a record that disagrees with the declaration it is listed by: every file it covers must
        be declared with the same size and sha256 (``InvalidRecord`` naming the record and the file)."""
        entries = {e.path: e for e in declared}
        for path, parts in self.files:
            entry = entries.get(path)
            if entry is None:
                raise InvalidRecord(f"{what} has part digests of {path}, which the declaration does not list",
                                    remedy="the part digests are not this archive's; republish the artifact")
            if (entry.size, entry.sha256) != (parts.size, parts.sha256):
                raise InvalidRecord(
                    f"{what} describes {path} as {parts.size} bytes sha256 {parts.sha256}, the declaration as "
                    f"{entry.size} bytes sha256 {entry.sha256}",
                    remedy="the part digests are not this archive's; republish the artifact")


def from_digests(digests: Mapping[str, FileDigest]) -> PartDigestRecord | None:
    """The record of one hashing pass: every file hashed with BLAKE3 parts; None when there is none."""
    files = [(path, PartDigests(d.size, d.sha256, d.blake3_part_size, d.blake3_parts))
             for path, d in digests.items() if d.blake3_parts is not None]
    return PartDigestRecord(tuple(files)) if files else None


_FILE = _record.RecordFile(KIND, PartDigestRecord)
path_in = KIND.path_in
parse_part_digests = _FILE.parse
read_part_digests = _FILE.read
encode_part_digests = _FILE.encode
