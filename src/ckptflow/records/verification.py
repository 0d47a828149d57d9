"""The verification record ``.verified.json``: the outcome of the latest ``ckptflow verify`` (or the
workflow's verify step) of an artifact, beside its receipt, so ``ckptflow status`` shows a verification
run from the command line as well as the workflow's reports::

    <artifact>/.uploaded            the receipt that was checked
    <artifact>/.verified.json       {"protocol": "ckptflow.verification.v1", "status": "verified" | "failed",
                                     "verified_at": "2026-12-01T01:23:44Z", "read_data": false,
                                     "objects": 5, "not_ok": 0, "receipt_sha256": "<sha256 of .uploaded>"}

``receipt_sha256`` binds the outcome to the receipt's bytes: once the receipt is rewritten (another
publication) the record proves nothing and status shows it as stale. The record is never archived
(publish selects the manifest's components and its own records only) and holds no secret.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import _record

FILENAME = ".verified.json"
PROTOCOL = "ckptflow.verification.v1"

KIND = _record.RecordKind(filename=FILENAME, schema="verification", protocol=PROTOCOL)


@dataclass(frozen=True, slots=True)
class Verification:
    status: str  # verified | failed
    verified_at: str
    read_data: bool
    objects: int
    not_ok: int
    receipt_sha256: str

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> Verification:
        _record.check_object(KIND, data, what)
        return cls(status=data["status"],
                   verified_at=_record.require_utc_timestamp(data["verified_at"], what, "verified_at"),
                   read_data=data["read_data"], objects=data["objects"], not_ok=data["not_ok"],
                   receipt_sha256=_record.require_sha256(data["receipt_sha256"], what, "receipt_sha256"))

    def to_dict(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, "status": self.status, "verified_at": self.verified_at,
                "read_data": self.read_data, "objects": self.objects, "not_ok": self.not_ok,
                "receipt_sha256": self.receipt_sha256}


_FILE = _record.RecordFile(KIND, Verification)
path_in = KIND.path_in
read_verification = _FILE.read
write_verification = _FILE.write
