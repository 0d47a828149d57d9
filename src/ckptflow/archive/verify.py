"""Receipt-bound remote verification by HEAD (size + ``sha256`` metadata), optionally by content.

``check_remote_inventory`` is the one remote check: the publisher runs it before writing a receipt,
``verify`` runs it on a receipt, ``prune-verified`` runs it before deleting local bytes. Each object
ends in one state: ``ok``, ``missing``, ``changed`` (size or digest differs), or ``unverifiable``
(no ``sha256`` metadata). With ``read_data`` the bytes are downloaded and hashed as well.
"""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ..digest import sha256_bytes
from ..errors import NotFound, VerificationFailed
from ..records import declaration as declaration_record
from ..records import receipt as receipt_record
from ..records.inventory import FileEntry
from ..store.base import ObjectStore
from ..store.open import check_destination as open_check_destination
from .keys import object_key

HEAD_WORKERS = 16


@dataclass(frozen=True, slots=True)
class ObjectState:
    path: str
    key: str
    state: str  # ok | missing | changed | unverifiable
    detail: str = ""

    def to_dict(self) -> dict[str, str]:
        out = {"path": self.path, "key": self.key, "state": self.state}
        if self.detail:
            out["detail"] = self.detail
        return out


def _check_one(store: ObjectStore, prefix: str, entry: FileEntry, read_data: bool) -> ObjectState:
    key = object_key(prefix, entry.path)
    info = store.head(key)
    if info is None:
        return ObjectState(entry.path, key, "missing")
    if info.size != entry.size:
        return ObjectState(entry.path, key, "changed", f"size {info.size}, expected {entry.size}")
    if info.sha256 is None:
        return ObjectState(entry.path, key, "unverifiable", "no sha256 metadata")
    if info.sha256 != entry.sha256:
        return ObjectState(entry.path, key, "changed", f"sha256 metadata {info.sha256}, expected {entry.sha256}")
    if info.checksum_sha256 is not None and info.checksum_sha256 != entry.sha256:
        return ObjectState(entry.path, key, "changed", f"server checksum {info.checksum_sha256}, expected {entry.sha256}")
    if read_data:
        with tempfile.TemporaryDirectory(prefix="ckptflow-verify-") as tmp:
            got = store.download_file(key, Path(tmp) / "object", size=info.size)
        if got.sha256 != entry.sha256 or got.size != entry.size:
            return ObjectState(entry.path, key, "changed", f"content sha256 {got.sha256}, expected {entry.sha256}")
    return ObjectState(entry.path, key, "ok")


def check_remote_inventory(
    store: ObjectStore, prefix: str, entries: list[FileEntry] | tuple[FileEntry, ...], *, read_data: bool = False
) -> list[ObjectState]:
    """HEAD every entry under ``prefix`` concurrently; states in inventory order."""
    if not entries:
        return []
    with ThreadPoolExecutor(max_workers=min(HEAD_WORKERS, len(entries)), thread_name_prefix="verify") as pool:
        return list(pool.map(lambda e: _check_one(store, prefix, e, read_data), entries))


def check_declaration(store: ObjectStore, prefix: str, expected_sha256: str) -> ObjectState:
    """The remote declaration's bytes must hash to the digest the receipt (or staging record) binds."""
    key = object_key(prefix, declaration_record.FILENAME)
    info = store.head(key)
    if info is None:
        return ObjectState(declaration_record.FILENAME, key, "missing")
    got = sha256_bytes(store.get_bytes(key))
    if got != expected_sha256:
        return ObjectState(declaration_record.FILENAME, key, "changed", f"sha256 {got}, expected {expected_sha256}")
    return ObjectState(declaration_record.FILENAME, key, "ok")


def describe_failures(states: list[ObjectState], limit: int = 5) -> str:
    """The objects that are not ok, as one line: ``key: state (detail); …`` and how many more."""
    bad = [s for s in states if s.state != "ok"]
    shown = "; ".join(f"{s.key}: {s.state}{' (' + s.detail + ')' if s.detail else ''}" for s in bad[:limit])
    return shown + (f" (+{len(bad) - limit} more)" if len(bad) > limit else "")


def require_all_ok(states: list[ObjectState], where: str) -> None:
    if any(s.state != "ok" for s in states):
        raise VerificationFailed(
            f"remote copy at {where} does not match its inventory: {describe_failures(states)}",
            remedy="the archive is damaged; keep the local copy and republish to a new destination",
        )


def check_destination(store: ObjectStore, receipt: receipt_record.Receipt, artifact_dir: Path) -> None:
    """Refuse a receipt bound to another endpoint or bucket than the one the credentials reach."""
    open_check_destination(store, receipt.destination, what=str(receipt_record.path_in(artifact_dir)))


@dataclass(frozen=True)
class VerifyResult:
    artifact_dir: Path
    receipt: receipt_record.Receipt
    objects: list[ObjectState]
    read_data: bool = False

    @property
    def ok(self) -> bool:
        return all(o.state == "ok" for o in self.objects)

    def to_report(self) -> dict:
        """The ``verify`` report (schemas/report_verify.schema.json), for the CLI and the workflow alike."""
        return {
            "status": "verified" if self.ok else "failed",
            "artifact_dir": str(self.artifact_dir),
            "destination": self.receipt.destination.to_dict(),
            "read_data": self.read_data,
            "objects": [o.to_dict() for o in self.objects],
        }

    def failure_line(self) -> str:
        return (
            f"remote copy of {self.artifact_dir} does not match its receipt: {describe_failures(self.objects)}; "
            "keep the local copy and republish it to a new destination"
        )


def verify_artifact(artifact_dir: Path | str, store_for, *, read_data: bool = False) -> VerifyResult:
    """Check the remote objects recorded in ``artifact_dir/.uploaded``.

    ``store_for(receipt_destination)`` returns the store for the receipt's scheme and bucket, opened
    with the caller's credentials; its endpoint must equal the receipt's.
    """
    artifact_dir = Path(artifact_dir)
    path = receipt_record.path_in(artifact_dir)
    if not path.exists():
        raise NotFound(f"{path} does not exist: the artifact has no upload receipt", remedy="run `ckptflow publish` first")
    receipt = receipt_record.read_receipt(artifact_dir)
    store = store_for(receipt.destination)
    check_destination(store, receipt, artifact_dir)
    prefix = receipt.destination.prefix
    states = [check_declaration(store, prefix, receipt.declaration_sha256)]
    states += check_remote_inventory(store, prefix, receipt.files, read_data=read_data)
    return VerifyResult(artifact_dir=artifact_dir, receipt=receipt, objects=states, read_data=read_data)
