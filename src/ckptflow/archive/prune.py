"""``prune_verified``: free local disk only for artifacts whose remote copy is proven.

Applies only to ``checkpoint_artifacts/iter_*`` directories (full checkpoints under ``checkpoints/``
have their own retention). An artifact's payload files are removed only when all of these hold:

- a valid native manifest whose ``file`` components all carry digests;
- a JSON receipt (a legacy plain-text ``.uploaded`` proves nothing) bound to the endpoint the
  credentials reach, with a passing probe record for that endpoint;
- the receipt covers every file in the directory (an extra local file blocks pruning: publication
  never silently includes it);
- every local payload still hashes to the receipt's digest;
- every remote object still has the recorded size and ``sha256``.

Anything else keeps the copy with a reason. A remote object that claims the expected digest with
another size is reported as an error (the archive is inconsistent) and keeps the artifact.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ..artifact import ITER_DIR_RE
from ..errors import CkptflowError
from ..fsutil import walk_files
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from .keys import ARTIFACTS_DIR
from .publish import present_payload, rehash_against, remove_payload_files
from .verify import check_destination, check_remote_inventory, describe_failures

log = logging.getLogger(__name__)

# Files in an artifact directory that a receipt never lists: the receipt itself.
_NOT_ARCHIVED = frozenset({receipt_record.FILENAME})


@dataclass
class PruneReport:
    removed: list[dict] = field(default_factory=list)
    kept: list[dict] = field(default_factory=list)
    freed_bytes: int = 0
    dry_run: bool = False

    @property
    def has_errors(self) -> bool:
        return any(k.get("error") for k in self.kept)

    def to_report(self) -> dict:
        return {
            "status": "failed" if self.has_errors else ("dry-run" if self.dry_run else "done"),
            "dry_run": self.dry_run,
            "removed": self.removed,
            "kept": self.kept,
            "freed_bytes": self.freed_bytes,
        }


class _Keep(Exception):
    def __init__(self, reason: str, *, error: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.error = error


def artifact_dir_of(path: Path) -> Path:
    """An artifact directory, or the directory of a ``model.pt`` (any file) inside one."""
    return path.parent if path.is_file() else path


def _check_location(artifact_dir: Path) -> None:
    if not ITER_DIR_RE.match(artifact_dir.name) or artifact_dir.parent.name != ARTIFACTS_DIR:
        raise _Keep(f"not under {ARTIFACTS_DIR}/iter_*: prune-verified only releases artifact payloads")
    if not artifact_dir.is_dir():
        raise _Keep("directory does not exist")


def _plan_one(artifact_dir: Path, store_for, progress: bool | None) -> tuple[list[str], int]:
    """All the checks; returns the payload paths to remove and their size, or raises _Keep."""
    _check_location(artifact_dir)
    try:
        manifest = manifest_record.read_manifest(artifact_dir)
    except CkptflowError as exc:
        raise _Keep(f"no valid native manifest: {exc}") from None
    undigested = [e.path for e in manifest.physical_files() if e.sha256 is None]
    if undigested:
        raise _Keep(f"manifest has no digest for {undigested[:5]}; publish the artifact to record them")
    if receipt_record.is_legacy_receipt(artifact_dir):
        raise _Keep("legacy plain-text .uploaded proves no destination or digest; publish again to write a receipt")
    try:
        receipt = receipt_record.read_receipt(artifact_dir)
    except CkptflowError as exc:
        raise _Keep(f"no valid receipt: {exc}") from None
    try:
        store = store_for(receipt.destination)
        check_destination(store, receipt, artifact_dir)
        from .probe import require_qualified

        require_qualified(store, receipt.destination.prefix)
    except CkptflowError as exc:
        raise _Keep(str(exc)) from None

    recorded = {e.path: e for e in receipt.files}
    present = [p for p in walk_files(artifact_dir) if p not in _NOT_ARCHIVED and not _is_temp(p)]
    extra = [p for p in present if p not in recorded]
    if extra:
        raise _Keep(f"files not covered by the receipt: {extra[:5]}; they would be lost — publish a new artifact instead")
    payload = present_payload(artifact_dir, manifest)
    if not payload:
        return [], 0
    local, changed = rehash_against(artifact_dir, payload, recorded, progress=progress)
    if changed:
        raise _Keep(f"local bytes changed since publication: {changed[:5]}")
    states = check_remote_inventory(store, receipt.destination.prefix, receipt.files)
    bad = [s for s in states if s.state != "ok"]
    if bad:
        # Same digest, other size: the store is inconsistent, not merely incomplete.
        lying = any(s.state == "changed" and s.detail.startswith("size") and _claims_digest(store, s, recorded) for s in bad)
        raise _Keep(f"remote copy not verified: {describe_failures(states)}", error=lying)
    return payload, sum(d.size for d in local.values())


def _claims_digest(store, state, recorded) -> bool:
    info = store.head(state.key)
    return info is not None and info.sha256 == recorded[state.path].sha256


def _is_temp(relpath: str) -> bool:
    # Interrupted atomic writes of our own records (".<name>.<host>.<pid>.<token>.tmp").
    name = relpath.rsplit("/", 1)[-1]
    return name.startswith(".") and name.endswith(".tmp")


def prune_verified(paths: list[Path], store_for, *, dry_run: bool = False, progress: bool | None = None) -> PruneReport:
    """Check and prune each path; ``store_for(receipt_destination)`` opens the store with the caller's credentials."""
    report = PruneReport(dry_run=dry_run)
    seen: set[Path] = set()
    for raw in paths:
        artifact_dir = artifact_dir_of(Path(raw))
        key = artifact_dir.resolve()
        if key in seen:
            continue
        seen.add(key)
        try:
            payload, size = _plan_one(artifact_dir, store_for, progress)
        except _Keep as keep:
            entry = {"path": str(artifact_dir), "reason": keep.reason}
            if keep.error:
                entry["error"] = True
            report.kept.append(entry)
            continue
        if dry_run:
            report.removed.append({"path": str(artifact_dir), "files": payload, "bytes": size, "dry_run": True})
            report.freed_bytes += size
            continue
        freed = remove_payload_files(artifact_dir, payload) if payload else 0
        report.removed.append({"path": str(artifact_dir), "files": payload, "bytes": freed})
        report.freed_bytes += freed
    return report
