"""Where ``materialize`` stages an archived artifact, and what of it an invocation may remove afterwards.

The *named* stage is ``<stage-dir>/iter_N`` (``--stage-dir``, default ``<out>.stage``). It is used when
the caller keeps the stage (``--keep-staged``) or when it already exists (someone fetched there before);
materialize then never removes anything from it. Otherwise the invocation fetches into a *private* stage
``<stage-dir>.<host>.<pid>.<token>/iter_N``, a name no other process picks, so two concurrent requests
never share a stage by accident and one's cleanup cannot remove what the other is converting from.

Cleanup of a private stage removes only what this tool wrote there (the files ``.staged.json`` names,
their parts, the record), then each directory it created, and only while it is empty: a file another
job put there meanwhile stays, with the directories holding it. A private stage whose writer is gone
(this host, dead pid) is adopted by a rename to the new invocation's name, so a killed request's
download resumes instead of starting over.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..archive import stage as fetch_stage
from ..fsutil import InFlight, dead_temporaries, tagged_name

log = logging.getLogger("ckptflow.materialize")

_in_use = InFlight()  # private stages this process is using now


@dataclass
class Stage:
    root: Path  # the directory fetch writes iter_N into
    staged: Path  # root / iter_N
    private: bool  # root is this invocation's own, removed afterwards
    created: bool  # staged did not exist before this invocation
    made: list[Path] = field(default_factory=list)  # directories created for root, innermost first

    def report(self, *, kept: bool) -> dict:
        return {"path": str(self.staged), "created": self.created, "kept": kept}


def open_stage(named_root: Path, name: str, *, keep: bool) -> Stage:
    """The stage to fetch ``name`` (iter_N) into; see the module doc. Creates a private root only."""
    named = named_root / name
    if keep or os.path.lexists(named):
        return Stage(named_root, named, private=False, created=not os.path.lexists(named))
    made = _make_dirs(named_root.parent)
    root = _adopt(named_root) or _new_private(named_root)
    _in_use.claim(root)
    return Stage(root, root / name, private=True, created=True, made=made)


def close_stage(stage: Stage) -> bool:
    """Remove what this invocation may of ``stage``; returns whether anything of it is left (kept)."""
    if not stage.private:
        return True
    _in_use.unclaim(stage.root)
    left: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(os.scandir(stage.root), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                left += [f"{entry.name}/{p}" for p in fetch_stage.remove_own_copy(Path(entry.path))]
            else:
                left.append(entry.name)
    if left:
        log.warning("kept %s: it holds files this request did not write (%s)", stage.root, ", ".join(left))
        return True
    for directory in [stage.root, *stage.made]:
        try:
            os.rmdir(directory)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
            break  # someone else's files are in it: it and the directories above it stay
    return False


def _make_dirs(path: Path) -> list[Path]:
    """``mkdir -p path``; returns the directories this call created, innermost first."""
    missing = []
    for p in (path, *path.parents):
        if os.path.lexists(p):
            break
        missing.append(p)
    made = []
    for p in reversed(missing):
        try:
            os.mkdir(p)
        except FileExistsError:
            continue  # another process made it: not ours to remove
        made.append(p)
    return list(reversed(made))


def _private_name(named_root: Path) -> Path:
    return named_root.with_name(tagged_name(named_root.name))


def _new_private(named_root: Path) -> Path:
    root = _private_name(named_root)
    os.mkdir(root)
    return root


def _adopt(named_root: Path) -> Path | None:
    """Rename a dead invocation's private stage of ``named_root`` to a new own name; None when there is none."""
    for path in dead_temporaries(named_root.parent, {named_root.name}, kind="dir", in_flight=_in_use.snapshot()):
        root = _private_name(named_root)
        try:
            os.rename(path, root)
        except FileNotFoundError:  # another request adopted it first
            continue
        log.info("adopted %s, the stage of a killed materialize, as %s", path, root)
        return root
    return None
