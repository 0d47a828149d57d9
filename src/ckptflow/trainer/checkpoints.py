"""A run's full checkpoints ``<run>/<ts>/checkpoints/iter_N``: which are complete, and what ``latest`` names.

**Complete vs in progress.** A save marks itself in progress with ``.save-in-progress`` in its directory,
created (exclusively) before its first byte and removed after its last (``begin_checkpoint_save`` /
``finish_checkpoint_save``; ``write_artifact`` does the same in ``checkpoint_artifacts/iter_N``). A
checkpoint is *complete* when it is a real directory holding ``trainer.pt`` and no ``.save-in-progress``:
a save killed half way keeps its marker and stays incomplete. Auto resume never picks, and retention
never counts among the last N nor deletes, an incomplete checkpoint. A saver that writes no marker cannot
be told apart while its shards are still coming: it should write ``trainer.pt`` last, or use the marker.

**latest.** A run's pointer is a symlink ``checkpoints/latest`` or a file ``latest`` /
``latest_checkpointed_iteration.txt`` holding ``N``, ``iter_N`` (any zero padding, trailing ``/`` allowed)
or a path (absolute, or relative to ``checkpoints/``) whose last segment is ``iter_N`` and whose parent is
this run's ``checkpoints/``. It is resolved by iteration number to the ``iter_*`` directories of this
run. A pointer that exists but resolves to no checkpoint directory of this run is ``UnresolvedPointer``,
naming the pointer and its content.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from ..errors import Refused
from ..fsutil import create_exclusive_bytes, host_tag
from .ownership import IN_PROGRESS
from .write import TRAINER_FILE

CHECKPOINTS_DIR = "checkpoints"
LATEST_NAMES = ("latest", "latest_checkpointed_iteration.txt")
_ITER_NAME = re.compile(r"^iter_(\d+)$")


class UnresolvedPointer(Refused):
    """A ``latest`` pointer exists but names no checkpoint directory of this run."""


def iteration_of_name(name: str) -> int | None:
    m = _ITER_NAME.match(name)
    return int(m.group(1)) if m else None


def is_complete_checkpoint(ckpt_dir: Path) -> bool:
    """A real directory holding ``trainer.pt`` and no ``.save-in-progress`` marker."""
    return (ckpt_dir.is_dir() and not ckpt_dir.is_symlink() and (ckpt_dir / TRAINER_FILE).is_file()
            and not os.path.lexists(ckpt_dir / IN_PROGRESS))


def checkpoint_dirs(checkpoints: Path) -> dict[Path, int]:
    """Every real ``iter_N`` directory under ``checkpoints/`` with its iteration (complete or not)."""
    found = {}
    if checkpoints.is_dir():
        for d in checkpoints.iterdir():
            it = iteration_of_name(d.name)
            if it is not None and d.is_dir() and not d.is_symlink():
                found[d] = it
    return found


def begin_checkpoint_save(ckpt_dir: Path | str) -> Path:
    """Create ``ckpt_dir`` (if needed) and its ``.save-in-progress`` marker before the save writes anything.

    Refuses a directory already marked (another save, or a killed one: remove the marker once the
    directory is known to be complete, or discard the directory)."""
    root = Path(ckpt_dir)
    root.mkdir(parents=True, exist_ok=True)
    holder = {"host": host_tag(), "pid": os.getpid(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    marker = root / IN_PROGRESS
    if not create_exclusive_bytes(marker, (json.dumps(holder, sort_keys=True) + "\n").encode()):
        raise Refused(f"{marker} already exists: a save of {root} is in progress or was interrupted",
                      remedy="let that save finish; for a killed save, discard the directory or save under another iteration")
    return marker


def finish_checkpoint_save(ckpt_dir: Path | str) -> None:
    """Remove the marker ``begin_checkpoint_save`` created, after the save's last byte is on disk."""
    os.unlink(Path(ckpt_dir) / IN_PROGRESS)


def _pointer_text(pointer: Path) -> str:
    if pointer.is_symlink():
        return os.readlink(pointer)
    return pointer.read_text(encoding="utf-8", errors="replace").strip()


def _resolve(checkpoints: Path, text: str, dirs: dict[Path, int]) -> list[Path]:
    value = text.strip().rstrip("/")
    if value.isdigit():
        it = int(value)
    else:
        if not value:
            return []
        target = Path(value) if os.path.isabs(value) else checkpoints / value
        # The pointer must stay inside this run: its parent is this run's checkpoints/ (real paths).
        if os.path.realpath(target.parent) != os.path.realpath(checkpoints):
            return []
        it = iteration_of_name(target.name)
        if it is None:
            return []
    return sorted(d for d, n in dirs.items() if n == it)


def latest_checkpoints(checkpoints: Path) -> list[Path]:
    """The checkpoint directories the run's pointers name (empty when there is no pointer); raises
    ``UnresolvedPointer`` for a pointer that exists but resolves to no checkpoint directory of this run."""
    dirs = checkpoint_dirs(checkpoints)
    named: set[Path] = set()
    for name in LATEST_NAMES:
        pointer = checkpoints / name
        if not os.path.lexists(pointer):
            continue
        if pointer.is_dir() and not pointer.is_symlink():
            text = "(a directory)"
            found = []
        else:
            text = _pointer_text(pointer)
            found = _resolve(checkpoints, text, dirs)
        if not found:
            raise UnresolvedPointer(
                f"{pointer} holds {text!r}, which names no checkpoint directory under {checkpoints}",
                remedy=f"point {name} at the run's resume checkpoint (N or iter_N of an existing "
                       f"{CHECKPOINTS_DIR}/iter_N) or remove it; nothing was deleted")
        named.update(found)
    return sorted(named)
