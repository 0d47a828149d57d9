"""The upload receipt ``.uploaded``: proof that the remote copy of this artifact was verified.

Written in the artifact directory after every remote object matched the declaration; it is what
``prune-verified`` requires before deleting local bytes::

    iter_0000300/
    ├── .posttrain-checkpoint-artifact.json
    ├── model.pt
    └── .uploaded          this record

    {
      "declaration_sha256": "<hex of the remote .posttrain-archive.json bytes>",
      "destination": {"bucket": "ckpts", "endpoint": "s3.example.org:9000", "prefix": "run1/iter_0000300",
                      "scheme": "s3"},
      "files": [{"path": "model.pt", "sha256": "<hex>", "size": 1234}, ...],
      "protocol": "posttrain.archive-marker.v1",
      "server_checksums": {"model.pt": "<base64>", "optim/__0_0.distcp": "<base64>-3", ...},
      "uploaded_at": "2025-01-31T12:00:00Z"
    }

``server_checksums`` holds, per file, the checksum the endpoint itself computed and reported at
publication (S3 ``ChecksumSHA256``: whole-object, or ``-N`` composite of N parts) where it was shown to
be the checksum of the published bytes. A file without one (the endpoint computes none: GCS, file://,
servers without checksums) can be proven only by reading its bytes. The field is optional on read:
a receipt without it (written before it existed) proves no file by checksum.

The endpoint is an authority (host[:port]; for ``file``, the archive root path) and never a secret:
a value with ``@``, ``?``, ``#`` or whitespace is refused on write and on read.

A *legacy* ``.uploaded`` is a plain-text marker from older tooling (not JSON). It says an upload
happened but binds no digest, so it can never authorize pruning: ``read_receipt`` refuses it by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import InvalidRecord
from ..jsonio import decode_json_object
from . import _record
from .inventory import FileEntry, inventory_from_list, inventory_to_list, sorted_entries

FILENAME = ".uploaded"
PROTOCOL = "posttrain.archive-marker.v1"
_LEGACY_REMEDY = (
    "a legacy marker cannot authorize pruning; publish or verify the artifact again to write a "
    f"{PROTOCOL} receipt"
)

KIND = _record.RecordKind(
    filename=FILENAME,
    schema="receipt",
    protocol=PROTOCOL,
    legacy_remedy=_LEGACY_REMEDY,
    precheck=_record.check_destination,
)


@dataclass(frozen=True, slots=True)
class ReceiptDestination:
    """Where the archive lives: the non-secret identity of the store plus the artifact's key prefix."""

    scheme: str
    endpoint: str
    bucket: str
    prefix: str

    @classmethod
    def at(cls, destination: Any, prefix: str) -> ReceiptDestination:
        """From a store's ``Destination`` (anything with scheme, endpoint and bucket) and a key prefix."""
        return cls(
            scheme=destination.scheme, endpoint=destination.endpoint, bucket=destination.bucket, prefix=prefix
        )

    def to_dict(self) -> dict[str, str]:
        return {
            "scheme": self.scheme,
            "endpoint": self.endpoint,
            "bucket": self.bucket,
            "prefix": self.prefix,
        }


@dataclass(frozen=True, slots=True)
class Receipt:
    destination: ReceiptDestination
    declaration_sha256: str
    files: tuple[FileEntry, ...]
    uploaded_at: str
    # path -> server checksum recorded at publication; None: an older receipt that records none.
    server_checksums: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", sorted_entries(self.files))
        if self.server_checksums is not None:
            object.__setattr__(self, "server_checksums", dict(sorted(self.server_checksums.items())))

    def entry(self, path: str) -> FileEntry | None:
        return next((e for e in self.files if e.path == path), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> Receipt:
        _record.check_object(KIND, data, what)
        dest = data["destination"]
        return cls(
            destination=ReceiptDestination(
                scheme=dest["scheme"], endpoint=dest["endpoint"], bucket=dest["bucket"], prefix=dest["prefix"]
            ),
            declaration_sha256=_record.require_sha256(data["declaration_sha256"], what, "declaration_sha256"),
            files=inventory_from_list(data["files"], what),
            uploaded_at=_record.require_utc_timestamp(data["uploaded_at"], what, "uploaded_at"),
            server_checksums=_checksums(data, what),
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "protocol": PROTOCOL,
            "destination": self.destination.to_dict(),
            "declaration_sha256": self.declaration_sha256,
            "files": inventory_to_list(self.files),
            "uploaded_at": self.uploaded_at,
        }
        if self.server_checksums is not None:
            out["server_checksums"] = dict(self.server_checksums)
        return out


def _checksums(data: Mapping[str, Any], what: str) -> dict[str, str] | None:
    """``server_checksums`` (schema-checked), every key a file of the receipt; None when absent."""
    if "server_checksums" not in data:
        return None
    checksums = dict(data["server_checksums"])
    paths = {f["path"] for f in data["files"]}
    unknown = sorted(set(checksums) - paths)
    if unknown:
        raise InvalidRecord(
            f"{what}: server_checksums names {unknown[:5]}, which are not among its files",
            remedy="the receipt is corrupt; publish or verify the artifact again to rewrite it",
        )
    return checksums


def path_in(directory: Path | str) -> Path:
    return Path(directory) / FILENAME


def _looks_legacy(data: bytes) -> bool:
    # A BOM before "{" is a broken JSON receipt (refused by name as such), not a legacy marker.
    return not data.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n").startswith(b"{")


def is_legacy_receipt(source: Path | str) -> bool:
    """True when ``.uploaded`` exists in ``source`` (or is the file ``source``) and is not JSON."""
    path = _record.record_path(source, FILENAME)
    try:
        return _looks_legacy(path.read_bytes())
    except (FileNotFoundError, IsADirectoryError):
        return False


def parse_receipt(data: bytes, *, what: str = FILENAME) -> Receipt:
    if _looks_legacy(data):
        raise _record.LegacyRecord(
            f"{what} is a legacy plain-text marker, not a {PROTOCOL} receipt", remedy=_LEGACY_REMEDY
        )
    return Receipt.from_dict(decode_json_object(data, what=what), what=what)


def read_receipt(source: Path | str) -> Receipt:
    return _record.read_record(KIND, source, parse_receipt)


def encode_receipt(record: Receipt) -> bytes:
    return _record.encode_record(record, what=FILENAME)


def write_receipt(directory: Path | str, record: Receipt) -> Path:
    """Write atomically; only after the remote copy was verified against the declaration."""
    return _record.write_record(KIND, path_in(directory), record)
