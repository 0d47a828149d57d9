"""Full-checkpoint retention: ``<run_dir>/checkpoints/`` keeps ``latest`` and the last N resumable checkpoints.

A resumable checkpoint is a ``checkpoints/iter_N`` directory holding ``trainer.pt``. Older ones are
deleted only once uploaded, proven by ``.uploaded`` in the checkpoint directory (``upload_gap``): a legacy
plain-text marker satisfies the gate by its existence alone (it never satisfies the artifact prune gate,
which reads and verifies a receipt); a JSON receipt must parse and validate (a full-checkpoint receipt,
see ``write_checkpoint_receipt``, or an artifact receipt) and still describe the directory: every file
covered, each of its recorded size, each transactional override of its recorded digest; otherwise the
checkpoint is kept with the reason. Anything else under ``checkpoints/`` (incomplete saves, files) is left alone, and
``checkpoint_artifacts/`` is never looked at: artifact pruning (``prune-verified``) and this retention
never touch each other's directories.

``checkpoint_provenance`` is the identity of a checkpoint's files (path and size) that a successor may
record; ``.uploaded``, its interrupted-write temporary ``.uploaded.tmp`` and the receipt writer's own
temporaries are excluded, so archive bookkeeping never invalidates a checkpoint's successor.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..artifact import ITER_DIR_RE
from ..digest import sha256_file
from ..errors import CkptflowError, NotFound, UnsafePath, UsageError
from ..fsutil import parse_tagged_name, temp_stem
from ..records import receipt as receipt_record
from ..records import utc_timestamp
from ..records.inventory import FileEntry, damaged_entry
from .write import TRAINER_FILE

log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
UPLOADED = ".uploaded"
BOOKKEEPING = frozenset({UPLOADED, UPLOADED + ".tmp"})
LATEST_NAMES = ("latest", "latest_checkpointed_iteration.txt")


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


def write_checkpoint_receipt(
    ckpt_dir: Path | str,
    destination: receipt_record.ReceiptDestination,
    *,
    overrides: Iterable[str] | None = None,
    uploaded_at: str | None = None,
) -> receipt_record.CheckpointReceipt:
    """Write ``ckpt_dir/.uploaded`` as a full-checkpoint receipt, after the checkpoint's upload to
    ``destination`` finished: every file of ``checkpoint_provenance`` is a bulk entry (path and size, never
    hashed) except ``overrides`` (relative paths of files rewritten in place, e.g. a pointer), which are
    hashed. ``overrides=None`` takes the pointer files (``LATEST_NAMES``) present at the checkpoint's top."""
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
    record = receipt_record.CheckpointReceipt(
        destination=destination,
        files=tuple(FileEntry(p, s) for p, s in files.items() if p not in chosen),
        overrides=tuple(FileEntry(p, files[p], sha256_file(root / p).sha256) for p in chosen),
        uploaded_at=uploaded_at or utc_timestamp(),
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
    if receipt_record.is_legacy_receipt(ckpt_dir):
        return None  # existence is this gate; it never satisfies an artifact gate
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
    return f"changed since its upload: {damage}" if damage else None


def latest_checkpoint(checkpoints: Path) -> Path | None:
    """What ``latest`` names: a symlink to ``iter_N``, or a text file holding ``iter_N`` or ``N``."""
    for name in LATEST_NAMES:
        p = checkpoints / name
        if p.is_symlink():
            return checkpoints / Path(os.readlink(p)).name
        if p.is_file():
            text = p.read_text(encoding="utf-8", errors="replace").strip()
            if text.isdigit():
                matches = [d for d in checkpoints.glob("iter_*") if ITER_DIR_RE.match(d.name)
                           and int(ITER_DIR_RE.match(d.name).group(1)) == int(text)]
                return matches[0] if matches else None
            if ITER_DIR_RE.match(text):
                return checkpoints / text
    return None


@dataclass
class RetentionReport:
    run_dir: str
    keep_last: int
    dry_run: bool
    latest: str | None = None
    removed: list[str] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)
    freed_bytes: int = 0

    def to_report(self) -> dict[str, Any]:
        return {"status": "dry-run" if self.dry_run else "retained", "run_dir": self.run_dir,
                "keep_last": self.keep_last, "dry_run": self.dry_run, "latest": self.latest,
                "removed": self.removed, "kept": self.kept, "freed_bytes": self.freed_bytes}


def retain_checkpoints(run_dir: Path | str, keep_last: int, *, dry_run: bool = False) -> RetentionReport:
    """Delete uploaded resumable checkpoints older than the last ``keep_last`` (``latest`` always kept)."""
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
        raise UsageError(f"--keep-last {keep_last!r} is not an integer >= 0")
    run = Path(run_dir).absolute()
    checkpoints = run / CHECKPOINTS_DIR
    if not checkpoints.is_dir():
        raise NotFound(f"{checkpoints} does not exist", remedy="pass the attempt directory <run>/<ts> holding checkpoints/")
    if checkpoints.is_symlink():
        raise UnsafePath(f"{checkpoints} is a symlink", remedy="pass the real run directory")
    report = RetentionReport(str(run), keep_last, dry_run)
    latest = latest_checkpoint(checkpoints)
    report.latest = str(latest) if latest is not None else None
    resumable = sorted(
        (int(m.group(1)), d) for d in checkpoints.iterdir()
        if (m := ITER_DIR_RE.match(d.name)) and d.is_dir() and not d.is_symlink() and (d / TRAINER_FILE).is_file()
    )
    recent = {d for _, d in resumable[len(resumable) - keep_last:]} if keep_last else set()
    for _, d in resumable:
        if latest is not None and d.name == latest.name:
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
            report.freed_bytes += size
    return report
