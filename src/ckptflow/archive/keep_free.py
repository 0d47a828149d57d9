"""Free disk to a target: ``prune-verified --runs-root R --keep-free SIZE|PCT [--keep-newest K]``.

Plan, then do (``plan_order`` returns the order; ``keep_free`` walks it):

- Candidates are the committed artifacts under R (``artifact.committed_artifacts``, the runs ``status``
  shows) that still hold a payload file, less the newest ``keep_newest`` of each run (highest iteration
  numbers among its committed artifacts; default 1, never 0: a run keeps the checkpoint it would resume
  from), and only those on R's own file system: an artifact whose directory or a payload file is on
  another device (``st_dev``: a file system mounted inside R, a run linked in from elsewhere) frees nothing
  toward the target and is kept, saying so, so the dry run and the real run pick the same artifacts.
- **Oldest first**: within a run in iteration order; across runs by publication time (the receipt's
  ``uploaded_at``), by merging the runs' queues on the time of each queue's next artifact, so a run's
  later iteration never goes before its earlier one. An artifact without a readable receipt sorts last
  (its prune is refused by the gates anyway, with the reason).
- Each candidate goes through every gate of ``prune_verified`` (``prune.prune_one``), and one more: an
  artifact another process reads in place (a materialize's or a merge's reader mark) or writes (a fetch's or merge's
  lock held beside it) is kept, naming it; its open files would free nothing, so the next one goes. So is
  one with a payload that has another name (a hard link: a Trainer's ``checkpoint-N`` an older export
  linked), naming those names, in the dry run and the real run alike: unlinking it gives nothing back.
- The target is ``SIZE`` bytes (``20G``: binary units; a bare number is refused) or ``PCT`` of the file system's size (``15%``),
  free to this user as ``statvfs`` reports it (``f_bavail``, ``df``'s "available"). The real run measures
  the free space again after each artifact and stops as soon as the target is met; a dry run deletes
  nothing and computes the free space after from the sizes it would free (each file rounded up to the
  file system's block), so it stops where the real run would on a file system nobody else writes to.

Every candidate not freed is in the report's ``kept`` with its reason (a gate, ``newest``, or ``not
needed``: the target was met before it). A target that cannot be met is not an error: the report says
``met: false`` and how much is free.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..artifact import ARTIFACTS_DIR, ITER_DIR_RE, committed_artifacts
from ..errors import CkptflowError, UsageError
from ..fsutil import require_directory
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from . import space
from .prune import PruneReport, kept_entry, prune_one
from .release import present_payload
from .verify import READ_ALL, READ_NONE

_UNITS = {"B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_NUMBER = r"^\s*(?P<n>[0-9]+(?:\.[0-9]+)?)\s*"
_SIZE_RE = re.compile(_NUMBER + r"(?:(?P<unit>[KMGTP])(?:I?B)?|(?P<bytes>B))\s*$", re.IGNORECASE)
_PCT_RE = re.compile(_NUMBER + r"%\s*$")
_BARE_RE = re.compile(_NUMBER + r"$")
_SPELLINGS = "pass e.g. --keep-free 20G (binary units B, K, M, G, T; 20GiB and 20GB spell the same) or --keep-free 15%"


@dataclass(frozen=True)
class Target:
    """``--keep-free``: ``nbytes`` bytes, or ``percent`` of the file system's size."""

    text: str
    nbytes: int | None = None
    percent: float | None = None

    def bytes_of(self, fs_bytes: int) -> int:
        return self.nbytes if self.nbytes is not None else -(-int(fs_bytes * self.percent) // 100)


def parse_target(value: object) -> Target:
    """``20G``, ``512M``, ``1.5T``, ``1073741824B`` (K/M/G/T/P are powers of 1024, ``GiB``/``GB`` spell the
    same, ``B`` is bytes) or ``15%`` (0-100 of the file system's size); anything else is a usage error. A bare
    number is refused: ``20`` would mean 20 bytes, a target met on any disk, where 20G was meant."""
    text = str(value).strip()
    if m := _PCT_RE.match(text):
        percent = float(m["n"])
        if percent <= 100:
            return Target(text, percent=percent)
    elif m := _SIZE_RE.match(text):
        return Target(text, nbytes=int(float(m["n"]) * _UNITS[(m["unit"] or m["bytes"]).upper()]))
    elif _BARE_RE.match(text):
        raise UsageError(f"--keep-free {text} needs a unit: a size such as {text}G or a percentage such as {text}%",
                         remedy=_SPELLINGS)
    raise UsageError(f"--keep-free must be a size such as 20G or a percentage such as 15%, got {text!r}",
                     remedy=_SPELLINGS)


def check_keep_newest(value: object) -> int:
    """``--keep-newest``: an integer >= 1 (the newest artifact of a run is never freed by a target)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"--keep-newest must be an integer >= 1, got {value!r}",
                         remedy="pass e.g. --keep-newest 1 (the newest artifact of each run stays)")
    return value


@dataclass(frozen=True)
class Candidate:
    run: str
    iteration: int
    path: Path
    published_at: str | None  # the receipt's uploaded_at; None without a readable receipt


def plan_order(runs_root: Path, keep_newest: int) -> tuple[list[Candidate], list[dict]]:
    """(candidates oldest first, kept entries for the newest of each run and for those on another file
    system than ``runs_root``); see the module doc."""
    device = os.stat(runs_root).st_dev
    by_run: dict[str, list[tuple[int, Path]]] = {}
    for run, name in committed_artifacts(runs_root):
        path = Path(runs_root) / run / ARTIFACTS_DIR / name
        by_run.setdefault(run, []).append((int(ITER_DIR_RE.match(name).group(1)), path))
    queues: list[list[Candidate]] = []
    newest: list[dict] = []
    for run, found in sorted(by_run.items()):
        found.sort()
        older, kept = found[:-keep_newest], found[-keep_newest:]
        newest += [kept_entry(path, f"one of the newest {keep_newest} artifact(s) of run {run} (--keep-newest "
                              f"{keep_newest}); a target never frees it", False)
                   for _, path in kept if _holds_payload(path)]
        older = [(it, path) for it, path in older if _holds_payload(path)]
        elsewhere = [path for _, path in older if _devices(path) != {device}]
        newest += [kept_entry(path, f"on another file system than {runs_root}: freeing it gives no space there "
                              "(free it with prune-verified --paths, or --keep-free on a runs root on its file "
                              "system)", False) for path in elsewhere]
        queue = [Candidate(run, it, path, _published_at(path)) for it, path in older if path not in elsewhere]
        if queue:
            queues.append(queue)
    order = []
    while queues:
        head = min(queues, key=lambda q: (q[0].published_at is None, q[0].published_at or "", q[0].run))
        order.append(head.pop(0))
        if not head:
            queues.remove(head)
    return order, newest


def _holds_payload(path: Path) -> bool:
    """Whether any payload file the manifest names is still local (an unreadable manifest: assume so, the
    gates then say why it stays)."""
    try:
        return bool(present_payload(path, manifest_record.read_manifest(path)))
    except (CkptflowError, OSError):
        return True


def _devices(path: Path) -> set[int]:
    """The file systems (``st_dev``) of the artifact directory ``path`` and of its payload files present."""
    devices = {os.stat(path).st_dev}
    try:
        payload = present_payload(path, manifest_record.read_manifest(path))
    except (CkptflowError, OSError):
        return devices  # the gates say why it stays
    for rel in payload:
        with contextlib.suppress(OSError):
            devices.add(os.lstat(path / rel).st_dev)
    return devices


def _freed_by_unlinking(artifact_dir: Path, files: dict, device: int, block: int) -> int:
    """What unlinking the proven payloads ``files`` (relative path -> (st_dev, st_ino, size, mtime)) gives back
    on the file system ``device``: a file elsewhere frees nothing there, and neither does one with another
    name (a hard link: a Trainer's ``checkpoint-N``, a copy made with ``cp -l``), whose bytes stay."""
    freed = 0
    for rel, ident in files.items():
        try:
            links = os.lstat(artifact_dir / rel).st_nlink
        except OSError:
            continue
        if ident[0] == device and links == 1:
            freed += -(-ident[2] // block) * block
    return freed


def _published_at(path: Path) -> str | None:
    try:
        return receipt_record.read_receipt(path).uploaded_at
    except (CkptflowError, OSError):
        return None


def keep_free(runs_root: Path | str, target: Target, store_for, *, keep_newest: int = 1, dry_run: bool = False,
              read_data: bool = False, progress: bool | None = None,
              destinations: tuple[str, ...] | None = None) -> PruneReport:
    """Prune verified artifacts under ``runs_root``, oldest first, until its file system has ``target`` free."""
    runs_root = require_directory(runs_root, "runs root", "pass the directory holding <project>/<group>/<run>/<ts>")
    keep_newest = check_keep_newest(keep_newest)
    free, block, st = space.free_space(runs_root)
    device = os.stat(runs_root).st_dev
    want = target.bytes_of(st.f_blocks * block)
    order, newest = plan_order(runs_root, keep_newest)
    report = PruneReport(dry_run=dry_run, read_data=read_data, destinations=destinations)
    read = READ_ALL if read_data else READ_NONE
    now = free
    for i, cand in enumerate(order):
        if now >= want:
            report.kept += [kept_entry(c.path, f"not needed: {runs_root} had {space.size_text(now)} free, the target "
                                       f"is {space.size_text(want)} (--keep-free {target.text})", False)
                            for c in order[i:]]
            break
        checked = prune_one(report, cand.path, store_for, read, progress, in_use=True)
        if dry_run:
            now += _freed_by_unlinking(cand.path, checked.files, device, block) if checked else 0
        else:
            now = space.free_space(runs_root)[0]
    report.kept += newest
    report.keep_free = {
        "runs_root": str(runs_root), "target": target.text, "target_bytes": want, "keep_newest": keep_newest,
        "free_before": free, "free_after": now, "met": now >= want,
        "computed": dry_run,  # a dry run's free_after is computed from sizes, not measured
    }
    return report

