"""``prune_verified``: free local disk only for artifacts whose remote copy is proven.

Applies only to ``checkpoint_artifacts/iter_*`` directories (full checkpoints under ``checkpoints/``
have their own retention). An artifact's payload files are removed only when all of these hold:

- a valid native manifest whose ``file`` components all carry digests;
- a JSON receipt (a legacy plain-text ``.uploaded`` proves nothing) bound to this artifact (its prefix
  names this ``iter_N``, it records this manifest's digest) and to the endpoint the credentials reach,
  with a passing probe record for that endpoint; each destination the receipt lists is checked (or each
  one the operator names, ``--destination``), and the copy at every one of them must be proven;
- the receipt covers every file in the directory (an extra local file blocks pruning: publication
  never silently includes it);
- the checks of ``release.prove_release``: every local payload still hashes to the receipt's digest,
  and every remote object is proven by its recorded server checksum or, with ``read_data`` (always on
  ``file://``), by reading and hashing its bytes; user metadata alone proves nothing.

Each file is then unlinked only while it is still the file that was hashed (``release.unlink_checked``).
``freed_bytes`` counts only what the file system got back: a payload with another name (a hard link) is
unlinked from the artifact and listed in its entry's ``held`` with its other names, freeing nothing (a dry
run says the same from the link counts it reads).
A dry run writes nothing anywhere: where the real run would first probe the endpoint (no cached probe
record), it runs every other check and says so in the entry's ``needs`` instead of probing.
Freeing to a target (``keep_free.py``, ``in_use=True``) also keeps an artifact a live process reads in
place (its reader mark, ``lock.reading``: a materialize from ``--ckpt-dir``, a merge of its model.pt) or writes (a held
``iter_N.lock`` of a fetch into it, ``iter_N.merge.lock`` of a merge), naming that process, checked first
and again just before the first unlink: files held open free no space, so the next artifact goes
instead; and an artifact with a payload that has another name (a hard link: its bytes stay), in the dry run
and the real run alike. A prune of named ``--paths`` goes ahead under a reader (its open descriptor keeps reading the
same bytes, and a materialize that has not opened the file yet builds from the archive instead).
Anything else keeps the copy with a reason; a failure on one path (an unsafe file, an unreachable
endpoint) is a kept entry too, so the report always lists everything already removed. A kept entry is
an error (the command exits 1) when the path does not exist, when the archive no longer matches the
receipt (an object missing or changed, or a local payload that no longer hashes to it), when a remote
object claims the expected digest with another size, or on any unexpected failure; a proof that is only
missing (no receipt yet, no server checksum without ``--read-data``) keeps the copy without an error.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..artifact import ITER_DIR_RE, clear_stale_merge_marker, stale_merge_marker
from ..errors import CkptflowError, NotFound
from ..fsutil import walk_files
from ..lock import held_by, readers_of
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from ..records import verification as verification_record
from ..store.uri import destination_label
from .destinations import check_binding, select_destinations
from .keys import ARTIFACTS_DIR
from .release import (
    Checked,
    LocalChanged,
    NotProven,
    is_aside_name,
    prove_release,
    release_outcome,
    unlink_checked,
)
from .stage import is_part_name
from .verify import DAMAGED, READ_ALL, READ_NONE, check_receipt, describe_failures, effective_read

log = logging.getLogger(__name__)

# Files in an artifact directory that a receipt never lists: the receipt itself and the verification
# record written after it (both describe the archive; neither is part of it).
_NOT_ARCHIVED = frozenset({receipt_record.FILENAME, verification_record.FILENAME})


@dataclass
class PruneReport:
    removed: list[dict] = field(default_factory=list)
    kept: list[dict] = field(default_factory=list)
    freed_bytes: int = 0
    dry_run: bool = False
    read_data: bool = False
    keep_free: dict | None = None  # --keep-free: the target and the free space before and after
    # --destination: the receipt's destinations whose copies must verify (None: every one it lists)
    destinations: tuple[str, ...] | None = None

    @property
    def has_errors(self) -> bool:
        return any(k.get("error") for k in self.kept)

    def to_report(self) -> dict:
        return {
            "status": "failed" if self.has_errors else ("dry-run" if self.dry_run else "done"),
            "dry_run": self.dry_run,
            "read_data": self.read_data,
            "removed": self.removed,
            "kept": self.kept,
            "freed_bytes": self.freed_bytes,
        } | ({"keep_free": self.keep_free} if self.keep_free is not None else {})


class _Keep(Exception):
    def __init__(self, reason: str, *, error: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.error = error


def artifact_dir_of(path: Path) -> Path:
    """An artifact directory, or the directory of a ``model.pt`` (any file) inside one."""
    return path.parent if path.is_file() else path


def _check_location(artifact_dir: Path) -> None:
    if not os.path.lexists(artifact_dir):
        raise _Keep(f"{artifact_dir} does not exist; check the path", error=True)
    if not ITER_DIR_RE.match(artifact_dir.name) or artifact_dir.parent.name != ARTIFACTS_DIR:
        raise _Keep(f"not under {ARTIFACTS_DIR}/iter_*: prune-verified only releases artifact payloads")
    if not artifact_dir.is_dir():
        raise _Keep(f"{artifact_dir} is not a directory; pass a {ARTIFACTS_DIR}/iter_N directory", error=True)


# Locks a writer holds beside an artifact directory while it writes there: a fetch into it
# (``archive.stage.stage_lock``: ``iter_N.lock``), a merge (``merge.run.lock_path``: ``iter_N.merge.lock``),
# a restore refilling it (``archive.restore``: ``iter_N.restore.lock``).
_WRITER_LOCKS = {".lock": "a fetch into it", ".merge.lock": "a merge", ".restore.lock": "a restore refilling it"}


def _check_in_use(artifact_dir: Path) -> None:
    """Keep an artifact another process is using now: one that reads it in place (its reader mark) or
    writes it (its lock held)."""
    readers = readers_of(artifact_dir)
    if readers:
        raise _Keep(f"being read in place by {'; '.join(readers[:3])}: its files stay until that reader ends "
                    "(deleting them now would free no space while they are open); rerun prune-verified after it")
    for suffix, who in _WRITER_LOCKS.items():
        lock = artifact_dir.with_name(artifact_dir.name + suffix)
        holder = held_by(lock)
        if holder is not None:
            raise _Keep(f"in use by {who} ({holder}, holding {lock}): its files stay until it ends; rerun "
                        "prune-verified after it")


def _plan_one(artifact_dir: Path, store_for, read: str, progress: bool | None,
              dry_run: bool, in_use: bool, destinations: tuple[str, ...] | None = None) -> tuple[Checked, str | None]:
    """All the checks; returns the payload files proven (by identity) and, in a dry run, what the real
    run would still need (an endpoint probe, which writes), or raises _Keep."""
    _check_location(artifact_dir)
    if in_use:
        _check_in_use(artifact_dir)
    try:
        manifest = manifest_record.read_manifest(artifact_dir)
    except CkptflowError as exc:
        raise _Keep(f"no valid native manifest: {exc}") from None
    undigested = [e.path for e in manifest.physical_files() if e.sha256 is None]
    if undigested:
        raise _Keep(f"manifest has no digest for {undigested[:5]}; publish the artifact to record them")
    if receipt_record.is_legacy_receipt(artifact_dir):
        raise _Keep(f"legacy plain-text {receipt_record.FILENAME} proves no destination or digest; publish again to write a receipt")
    try:
        receipt = receipt_record.read_receipt(artifact_dir)
    except NotFound:
        raise _Keep(f"not published: no receipt {receipt_record.FILENAME}; publish it first "
                    f"(ckptflow publish --artifact-dir {artifact_dir})") from None
    except CkptflowError as exc:
        raise _Keep(f"no valid receipt: {exc}") from None
    try:  # a destination named that the receipt does not list: the operator's proof cannot be had
        chosen = select_destinations(receipt, destinations, str(receipt_record.path_in(artifact_dir)))
    except CkptflowError as exc:
        raise _Keep(str(exc), error=True) from None
    copies, needed = [], []  # (store, the receipt as that copy's proof), for every destination required
    try:
        from .probe import pending_probe, require_qualified

        for dest in chosen:
            store = store_for(dest)
            check_binding(store, receipt.at(dest), artifact_dir)
            if dry_run:  # the probe writes scratch objects and the cache: a dry run only says it would run
                needed.append(pending_probe(store, dest.prefix))
            else:
                require_qualified(store, dest.prefix)
            copies.append((store, receipt.at(dest)))
    except CkptflowError as exc:
        raise _Keep(str(exc)) from None
    needs = "; ".join(n for n in needed if n) or None
    (store, receipt), others = copies[0], copies[1:]

    stale = stale_merge_marker(artifact_dir)  # a killed merge's, beside its record: removed, never "extra"
    if stale is not None and not dry_run:
        clear_stale_merge_marker(artifact_dir)
    present = [p for p in walk_files(artifact_dir) if p not in _NOT_ARCHIVED and not _is_temp(p)
               and (stale is None or p != stale.name)]
    extra = [p for p in present if receipt.entry(p) is None]
    parts = [p for p in extra if is_part_name(p.rsplit("/", 1)[-1])]
    if parts:
        raise _Keep(f"download parts a restore left: {parts[:5]}; run `ckptflow restore --artifact-dir "
                    f"{artifact_dir}` (it removes them once every file is in place), then prune-verified again")
    if extra:
        raise _Keep(f"files not covered by the receipt: {extra[:5]} (not sealed in the artifact, so no archive holds "
                    "them and pruning would lose them); move them out of the artifact directory (a log, notes) and "
                    "prune again, or, if they belong to the checkpoint, save and publish a new artifact with them")
    for other_store, other in others:  # every other copy required must hold the declared bytes too
        states = check_receipt(other_store, other, read=effective_read(other_store, read))
        if any(s.state != "ok" for s in states):
            raise _Keep(f"remote copy of {artifact_dir} at {destination_label(other.destination, other.destination.prefix)} "
                        f"not proven: {describe_failures(states)}; keep the local copy (or name the destinations "
                        "to rely on with --destination)", error=any(s.state in DAMAGED for s in states))
    try:
        return prove_release(artifact_dir, store, receipt, manifest, read=read, progress=progress), needs
    except NotProven as exc:
        # An object missing or changed (remote, or a local payload rewritten since publish): the archive no
        # longer matches the receipt. Only "unverifiable" (no proof without reading) is a mere missing proof.
        raise _Keep(str(exc), error=any(s.state in DAMAGED for s in exc.states)) from None
    except LocalChanged as exc:  # the local bytes are in no archive: keeping them is right, and an error
        raise _Keep(str(exc), error=True) from None
    except CkptflowError as exc:
        raise _Keep(str(exc)) from None


def _is_temp(relpath: str) -> bool:
    # Interrupted atomic writes of our own records (".<name>.<host>.<pid>.<token>.tmp"), and payloads a
    # release set aside (".<name>.<host>.<pid>.<token>.aside": a dead one is released with the payloads).
    name = relpath.rsplit("/", 1)[-1]
    if is_aside_name(name):
        return True
    return name.startswith(".") and name.endswith(".tmp")


def prune_verified(paths: list[Path], store_for, *, dry_run: bool = False, read_data: bool = False,
                   progress: bool | None = None, destinations: tuple[str, ...] | None = None) -> PruneReport:
    """Check and prune each path; ``store_for(receipt_destination)`` opens the store with the caller's
    credentials. With ``read_data`` every remote object is read back and hashed before anything goes. The
    copy at every destination the receipt lists must be proven, or at each one ``destinations`` names."""
    report = PruneReport(dry_run=dry_run, read_data=read_data, destinations=destinations)
    seen: set[Path] = set()
    for raw in paths:
        artifact_dir = artifact_dir_of(Path(raw))
        key = artifact_dir.resolve()
        if key in seen:
            continue
        seen.add(key)
        prune_one(report, artifact_dir, store_for, READ_ALL if read_data else READ_NONE, progress)
    return report


def prune_one(report: PruneReport, artifact_dir: Path, store_for, read: str, progress: bool | None, *,
              in_use: bool = False) -> Checked | None:
    """One path's outcome into ``report``; a failure here never hides what other paths removed. Returns
    what was proven (and, but in a dry run, released), or None when the artifact was kept whole. With
    ``in_use``, an artifact another process reads or writes now is kept (see the module doc)."""
    try:
        checked, needs = _plan_one(artifact_dir, store_for, read, progress, report.dry_run, in_use,
                                   report.destinations)
        if in_use:
            _check_sole_names(artifact_dir, checked)
        if in_use and not report.dry_run:
            _check_in_use(artifact_dir)  # again: proving took a while, and a reader may have started
    except _Keep as keep:
        report.kept.append(kept_entry(artifact_dir, keep.reason, keep.error))
        return None
    except (CkptflowError, OSError) as exc:
        log.warning("prune %s: %s", artifact_dir, exc)
        report.kept.append(kept_entry(artifact_dir, str(exc), True))
        return None
    files = sorted(checked.files)
    if report.dry_run:
        freed, held = release_outcome(artifact_dir, checked)
        entry = {"path": str(artifact_dir), "files": files, "bytes": freed, "dry_run": True}
        report.removed.append(entry | ({"needs": needs} if needs else {}) | ({"held": held} if held else {}))
        report.freed_bytes += freed
        return checked
    released = unlink_checked(artifact_dir, checked)  # per-file failures come back as kept reasons
    if released.removed:
        report.removed.append({"path": str(artifact_dir), "files": released.removed, "bytes": released.freed_bytes}
                              | ({"held": released.held} if released.held else {}))
        report.freed_bytes += released.freed_bytes
    if released.kept:
        report.kept.append(kept_entry(artifact_dir, "; ".join(released.kept), False))
    elif not released.removed:
        report.removed.append({"path": str(artifact_dir), "files": [], "bytes": 0})
    return checked


def _check_sole_names(artifact_dir: Path, checked: Checked) -> None:
    """Freeing to a target: an artifact with a payload that has another name is kept (unlinking it gives
    nothing back, and the artifact would need a restore before a resume from it)."""
    _, held = release_outcome(artifact_dir, checked)
    if held:
        names = "; ".join(f"{h['file']} also as {', '.join(h['other_names'][:2]) or 'a name outside the run directory'}"
                          for h in held[:3]) + (f" (+{len(held) - 3} more)" if len(held) > 3 else "")
        raise _Keep(f"{len(held)} payload file(s) have another name ({names}): unlinking them frees nothing, so a "
                    "target never picks it (remove the other names first, e.g. the Trainer's checkpoint-N, or free it "
                    "by name with prune-verified --paths)")


def kept_entry(artifact_dir: Path, reason: str, error: bool) -> dict:
    """A ``kept`` entry of the report: the artifact, why, and whether that is an error (exit 1)."""
    entry = {"path": str(artifact_dir), "reason": reason}
    if error:
        entry["error"] = True
    return entry
