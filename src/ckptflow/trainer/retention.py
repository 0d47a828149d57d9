"""Full-checkpoint retention: ``<run_dir>/checkpoints/`` keeps ``latest`` and the last N complete checkpoints.

A complete checkpoint is a ``checkpoints/iter_N`` directory holding ``trainer.pt`` and no
``.save-in-progress`` marker (see ``checkpoints.py``); an incomplete one is never counted and never
deleted. ``latest`` is resolved by iteration number; a pointer that exists but names no checkpoint of
this run makes the whole command refuse (``UnresolvedPointer``) before anything is deleted.

Older complete checkpoints are deleted only once uploaded, proven by ``.uploaded`` (``upload_gap``): a
legacy plain-text marker or a JSON receipt (a full-checkpoint receipt, see ``write_checkpoint_receipt``,
or an artifact receipt) that must parse, validate and still describe the directory: every file covered,
each of its recorded size, each transactional override of its recorded digest. Then the rule that a
receipt proves only the bytes that existed when it was written:

- a receipt with ``identities`` (written by ``write_checkpoint_receipt`` now): every bulk file must show
  exactly the recorded ``(st_ino, st_size, st_mtime_ns, st_ctime_ns)``. Only equality is used, never an
  ordering of two clocks, so clock skew between hosts does not matter; ``ctime`` is set by the file
  system on every write, rename or ``utime`` and cannot be set back by a user, so a re-save in place
  (same inode) or by rename (new inode) shows. A rewrite within one timestamp tick of the observation
  could keep ``ctime``: so a file whose recorded ``ctime`` lies within ``coarse_window`` (twice the
  coarsest decimal unit the timestamps are rounded to, at least 20 ms, 2 s on a 1-second file system) of
  the receipt's own ``ctime`` (same file system clock) is not provable. The writer waits out that window
  on the file system's clock before writing the receipt, so a receipt it writes is never in it;
- a receipt without identities (older full-checkpoint receipts, artifact receipts, legacy markers)
  proves nothing newer than itself: a file whose ``ctime`` or ``mtime`` is later than the receipt's
  ``ctime`` keeps the checkpoint (a file rewritten in the same tick as the receipt cannot be seen).

A kept checkpoint is always reported with its reason. Anything else under ``checkpoints/`` is left
alone, and ``checkpoint_artifacts/`` is never looked at: artifact pruning (``prune-verified``) and this
retention never touch each other's directories.

``checkpoint_provenance`` is the identity of a checkpoint's files (path and size) that a successor may
record; ``.uploaded``, its interrupted-write temporary ``.uploaded.tmp`` and the receipt writer's own
temporaries are excluded, so archive bookkeeping never invalidates a checkpoint's successor.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..digest import sha256_file
from ..errors import CkptflowError, NotFound, Refused, UnsafePath, UsageError
from ..fsutil import parse_tagged_name, require_directory, temp_stem, unique_temp_path
from ..records import receipt as receipt_record
from ..records import utc_timestamp
from ..records.inventory import FileEntry, damaged_entry
from ..records.receipt import FileIdentity
from .checkpoints import (
    CHECKPOINTS_DIR,
    LATEST_NAMES,
    checkpoint_dirs,
    is_complete_checkpoint,
    latest_checkpoints,
)
from .ownership import IN_PROGRESS

log = logging.getLogger(__name__)

UPLOADED = receipt_record.FILENAME
BOOKKEEPING = frozenset({UPLOADED, UPLOADED + ".tmp"})
MIN_WINDOW_NS = 20_000_000  # two jiffies at HZ=100: the kernel's coarse clock behind fine-grained ctime


def coarse_window(values_ns: Iterable[int]) -> int:
    """Twice the coarsest decimal unit (1 ns .. 1 s) that divides every timestamp, at least ``MIN_WINDOW_NS``:
    within it, a rewrite may leave a file's timestamps unchanged."""
    values = list(values_ns)
    tick = 1
    while tick < 1_000_000_000 and values and all(v % (tick * 10) == 0 for v in values):
        tick *= 10
    return max(2 * tick, MIN_WINDOW_NS)


def _fs_clock_past(root: Path, target_ns: int, ctimes: list[int], deadline_s: float = 10.0) -> None:
    """Wait until the file system's own clock (a probe file's ctime in ``root``) is at least ``target_ns``
    plus the coarse window of what it shows; the probe is a receipt-writer temporary, removed after."""
    probe = unique_temp_path(root / UPLOADED)
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        end = time.monotonic() + deadline_s
        while True:
            now = os.fstat(fd).st_ctime_ns
            if now - target_ns >= coarse_window([*ctimes, now]):
                return
            if time.monotonic() > end:
                raise Refused(f"the file system clock under {root} did not advance past {target_ns} ns",
                              remedy="check the file system's timestamps; no receipt was written")
            time.sleep(0.005)
            os.utime(fd)  # a metadata change: the file system stamps a fresh ctime
    finally:
        os.close(fd)
        os.unlink(probe)  # created above with O_EXCL: ours


def is_bookkeeping(name: str) -> bool:
    """``.uploaded``, ``.uploaded.tmp`` and the receipt writer's tagged temporaries of ``.uploaded``."""
    if name in BOOKKEEPING:
        return True
    parsed = parse_tagged_name(name, ".tmp")
    return parsed is not None and parsed[0] == f".{temp_stem(UPLOADED)}"


def checkpoint_provenance(ckpt_dir: Path | str) -> list[tuple[str, int]]:
    """Sorted (relative path, size) of every file of the checkpoint, archive bookkeeping excluded."""
    root = Path(ckpt_dir)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            if Path(dirpath) == root and is_bookkeeping(name):
                continue
            p = Path(dirpath) / name
            out.append((p.relative_to(root).as_posix(), p.lstat().st_size))
    return sorted(out)


def observe_checkpoint(ckpt_dir: Path | str) -> dict[str, FileIdentity]:
    """Every file's identity now (bookkeeping excluded): take it before an upload reads the bytes and pass
    it to ``write_checkpoint_receipt(observed=...)``, which refuses when anything changed meanwhile."""
    root = Path(ckpt_dir)
    return {p: FileIdentity.of(root / p) for p, _ in checkpoint_provenance(root)}


def write_checkpoint_receipt(
    ckpt_dir: Path | str,
    destination: receipt_record.ReceiptDestination,
    *,
    overrides: Iterable[str] | None = None,
    uploaded_at: str | None = None,
    observed: dict[str, FileIdentity] | None = None,
) -> receipt_record.CheckpointReceipt:
    """Write ``ckpt_dir/.uploaded`` as a full-checkpoint receipt, after the checkpoint's upload to
    ``destination`` finished: every file of ``checkpoint_provenance`` is a bulk entry (path and size, never
    hashed) except ``overrides`` (relative paths of files rewritten in place, e.g. a pointer), which are
    hashed. ``overrides=None`` takes the pointer files (``LATEST_NAMES``) present at the checkpoint's top.

    Each bulk file's identity is recorded as ``lstat`` shows it now; with ``observed`` (from
    ``observe_checkpoint`` before the upload read the bytes) any bulk file not showing that same identity
    refuses the receipt. Before writing, it waits until the file system's clock is past the coarse window
    of the newest recorded ``ctime`` and checks the identities once more (see the module docstring)."""
    root = Path(ckpt_dir)
    if root.is_symlink() or not root.is_dir():
        raise NotFound(f"{root} is not a checkpoint directory", remedy="pass the checkpoints/iter_N directory that was uploaded")
    files = dict(checkpoint_provenance(root))
    if overrides is None:
        overrides = [n for n in LATEST_NAMES if n in files]
    chosen = sorted(set(overrides))
    unknown = [p for p in chosen if p not in files]
    if unknown:
        raise NotFound(f"{root}: transactional override(s) {unknown[:5]} are not files of the checkpoint",
                       remedy="name overrides by their path relative to the checkpoint directory")
    bulk = [p for p in files if p not in chosen]
    identities = {p: FileIdentity.of(root / p) for p in bulk}
    if observed is not None:
        changed = sorted(p for p in bulk if observed.get(p) != identities[p])
        if changed:
            raise Refused(f"{root}: {changed[:5]} changed or appeared after the upload began reading the checkpoint",
                          remedy="upload the checkpoint again once its save has finished; no receipt was written")
    ctimes = [i.ctime_ns for i in identities.values()]
    _fs_clock_past(root, max(ctimes, default=0), ctimes)
    if {p: FileIdentity.of(root / p) for p in bulk} != identities or dict(checkpoint_provenance(root)) != files:
        raise Refused(f"{root} changed while its receipt was being written",
                      remedy="upload the checkpoint again once its save has finished; no receipt was written")
    record = receipt_record.CheckpointReceipt(
        destination=destination,
        files=tuple(FileEntry(p, files[p]) for p in bulk),
        overrides=tuple(FileEntry(p, files[p], sha256_file(root / p).sha256) for p in chosen),
        uploaded_at=uploaded_at or utc_timestamp(),
        identities=identities,
    )
    receipt_record.write_receipt(root, record)
    return record


def upload_gap(ckpt_dir: Path) -> str | None:
    """None when ``.uploaded`` lets retention delete ``ckpt_dir``; else why it does not (the kept reason)."""
    marker = ckpt_dir / UPLOADED
    if marker.is_symlink():
        return f"{UPLOADED} is a symlink, not a receipt"
    if not marker.exists():
        return f"not uploaded (no {UPLOADED})"
    if receipt_record.is_legacy_receipt(ckpt_dir):  # never satisfies an artifact gate
        return _identity_gap(ckpt_dir, None, set())  # it proves at most what existed when it was written
    try:
        receipt = receipt_record.read_any_receipt(ckpt_dir)
    except (CkptflowError, OSError) as exc:
        return f"{UPLOADED} is not a valid receipt: {exc}"
    # Digests are checked only for a full-checkpoint receipt's overrides: a bulk file is proven by its size
    # (re-hashing a multi-GB save is what its size-only entries avoid), an artifact receipt's files likewise.
    overrides = receipt.overrides if isinstance(receipt, receipt_record.CheckpointReceipt) else ()
    recorded = {e.path for e in (*receipt.files, *overrides)}
    uncovered = sorted({p for p, _ in checkpoint_provenance(ckpt_dir)} - recorded)
    if uncovered:
        return f"files not covered by its {UPLOADED}: {uncovered[:5]} (never uploaded; deleting would lose them)"
    damage = damaged_entry(ckpt_dir, receipt.files, record=UPLOADED, rehash=False) or damaged_entry(
        ckpt_dir, overrides, record=UPLOADED, rehash=True)
    if damage:
        return f"changed since its upload: {damage}"
    identities = receipt.identities if isinstance(receipt, receipt_record.CheckpointReceipt) else None
    return _identity_gap(ckpt_dir, identities, {e.path for e in overrides})


def _identity_gap(ckpt_dir: Path, identities: dict[str, FileIdentity] | None, digested: set[str]) -> str | None:
    """Why the receipt cannot prove the files now present are the bytes it saw (module docstring), or None."""
    receipt_ctime = os.lstat(ckpt_dir / UPLOADED).st_ctime_ns
    if identities is None:
        newer = sorted(p for p, _ in checkpoint_provenance(ckpt_dir) if p not in digested and max(
            (st := os.lstat(ckpt_dir / p)).st_ctime_ns, st.st_mtime_ns) > receipt_ctime)
        return (f"{newer[:5]} changed after its {UPLOADED} was written, which records no file identity and so "
                "proves nothing newer than itself (upload the checkpoint again)") if newer else None
    for path, recorded in identities.items():
        now = FileIdentity.of(ckpt_dir / path)
        if now != recorded:
            diff = ", ".join(f"{k} {getattr(recorded, k)} -> {getattr(now, k)}" for k in recorded.__slots__
                             if getattr(now, k) != getattr(recorded, k))
            return f"{path} was replaced or rewritten since its upload ({diff}); its {UPLOADED} proves older bytes"
    window = coarse_window([*(i.ctime_ns for i in identities.values()), receipt_ctime])
    late = sorted(p for p, i in identities.items() if receipt_ctime - i.ctime_ns < window)
    if late:
        return (f"{late[:5]} last changed within {window / 1e9:g} s of its {UPLOADED} (same file-system clock): "
                "timestamps this coarse cannot exclude a rewrite after the upload (upload the checkpoint again)")
    return None


@dataclass
class RetentionReport:
    run_dir: str
    keep_last: int
    dry_run: bool
    latest: str | None = None
    removed: list[str] = field(default_factory=list)
    removed_bytes: dict[str, int] = field(default_factory=dict)  # each removed path's size
    kept: list[dict[str, str]] = field(default_factory=list)
    freed_bytes: int = 0

    def to_report(self) -> dict[str, Any]:
        return {"status": "dry-run" if self.dry_run else "retained", "run_dir": self.run_dir,
                "keep_last": self.keep_last, "dry_run": self.dry_run, "latest": self.latest,
                "removed": self.removed, "removed_bytes": self.removed_bytes, "kept": self.kept,
                "freed_bytes": self.freed_bytes}


def retain_checkpoints(run_dir: Path | str, keep_last: int, *, dry_run: bool = False) -> RetentionReport:
    """Delete uploaded complete checkpoints older than the last ``keep_last`` (``latest`` always kept)."""
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        raise UsageError(f"--keep-last {keep_last!r} is not an integer >= 0")
    run = require_directory(Path(run_dir).absolute(), "run directory", "pass the attempt directory <run>/<ts>")
    checkpoints = run / CHECKPOINTS_DIR
    if not checkpoints.is_dir():
        raise NotFound(f"{checkpoints} does not exist", remedy="pass the attempt directory <run>/<ts> holding checkpoints/")
    if checkpoints.is_symlink():
        raise UnsafePath(f"{checkpoints} is a symlink", remedy="pass the real run directory")
    report = RetentionReport(str(run), keep_last, dry_run)
    latest = latest_checkpoints(checkpoints)  # an unresolvable pointer refuses before anything is deleted
    report.latest = str(latest[-1]) if latest else None
    complete = sorted((it, d) for d, it in checkpoint_dirs(checkpoints).items() if is_complete_checkpoint(d))
    recent = {d for _, d in complete[len(complete) - keep_last:]} if keep_last else set()
    for d in sorted(d for d in checkpoint_dirs(checkpoints) if os.path.lexists(d / IN_PROGRESS)):
        report.kept.append({"path": str(d), "reason": f"save in progress ({IN_PROGRESS}): not counted, never deleted"})
    for _, d in complete:
        if d in latest:
            report.kept.append({"path": str(d), "reason": "latest"})
        elif d in recent:
            report.kept.append({"path": str(d), "reason": f"one of the last {keep_last}"})
        elif (gap := upload_gap(d)) is not None:
            report.kept.append({"path": str(d), "reason": gap})
        else:
            size = sum(s for _, s in checkpoint_provenance(d)) + sum(
                (d / n).lstat().st_size for n in os.listdir(d) if is_bookkeeping(n))
            if not dry_run:
                shutil.rmtree(d)
                log.info("removed %s (%d bytes)", d, size)
            report.removed.append(str(d))
            report.removed_bytes[str(d)] = size
            report.freed_bytes += size
    return report
