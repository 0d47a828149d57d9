"""Free space for a fetch: refused by name before the first byte, and a disk that fills anyway named.

``check_space`` runs in fetch's read-only phase: the bytes still to write (the declared sizes of the
files not already verified in the stage, each rounded up to the file system's block, plus the manifest
and a few blocks for the records and directories) less what this fetch will reuse or remove first (the
blocks its dead ``.part`` files already hold: a resumed part keeps its prefix, the others are removed;
a copy of another source it replaces; a file of its own copy that no longer matches) must fit in the
space ``statvfs`` reports free to this user (``f_bavail``, what ``df`` shows as available), and the
file count in the free inodes where the file system counts them. A file system that reports no
capacity at all (some FUSE mounts) is not checked. ``CKPTFLOW_SPACE_CHECK=0`` switches the check off
for a file system whose free space understates what fits (compression, deduplication).

Another writer can still fill the disk during the download: ``out_of_space`` turns the ENOSPC (or
EDQUOT) of that moment into ``OutOfSpace`` naming the file being written, the bytes still needed and
the remedy; files verified before it stay in place and the rerun resumes.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from ..errors import InsufficientSpace, OutOfSpace
from ..records.inventory import FileEntry
from ..units import human_bytes
from . import stage

log = logging.getLogger(__name__)

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
RECORD_BLOCKS = 4  # .staged.json written twice through a temporary, the manifest's part, slack
_OFF = ("0", "false", "no", "off")


def enabled() -> bool:
    return os.environ.get("CKPTFLOW_SPACE_CHECK", "1").strip().lower() not in _OFF


def is_full(exc: BaseException) -> bool:
    """The error a write raises on a full disk or an exhausted quota."""
    return isinstance(exc, OSError) and exc.errno in FULL_ERRNOS


def size_text(n: int) -> str:
    """``12345 bytes (12.1 KiB)``: exact for scripts, readable for people (``units.human_bytes``)."""
    return f"{n} bytes" if n < 1024 else f"{n} bytes ({human_bytes(n)})"


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing ancestor: the file system the stage is (or will be) on."""
    for candidate in (path, *path.parents):
        if os.path.isdir(candidate):
            return candidate
    return Path(path.anchor or "/")


def _allocated(path: Path) -> int:
    """Bytes a regular file of one link holds on disk (what removing or truncating it can give back)."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    return st.st_blocks * 512 if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 else 0


def _round(n: int, block: int) -> int:
    return -(-n // block) * block


def needed_bytes(todo: Iterable[FileEntry], *, block: int, extra: int = 0, freed: Iterable[Path] = ()) -> int:
    """What writing ``todo`` (and ``extra`` small bytes, the manifest) takes, less what ``freed`` holds now."""
    todo = list(todo)
    dirs = {d for e in todo for d in PurePosixPath(e.path).parents if d.as_posix() != "."}
    need = sum(_round(e.size, block) for e in todo) + _round(extra, block) + (RECORD_BLOCKS + len(dirs)) * block
    return max(0, need - sum(_allocated(p) for p in set(freed)))


def free_space(path: Path) -> tuple[int, int, os.statvfs_result]:
    """(bytes free to this user, block size, the whole statvfs) of the file system ``path`` is or will be on."""
    st = os.statvfs(_existing(path))
    block = st.f_frsize or st.f_bsize or 4096
    return st.f_bavail * block, block, st


def check_space(staged: Path, todo: list[FileEntry], *, source: str, extra: int = 0, freed: Iterable[Path] = (),
                reserve: int = 0, reserve_for: str = "") -> None:
    """Refuse (``InsufficientSpace``) when writing ``todo`` into ``staged`` cannot fit; read-only.

    ``freed`` are files this fetch removes or truncates before it needs the space; ``reserve`` bytes
    must stay free afterwards for ``reserve_for`` (a caller's next step on the same file system).
    """
    if not todo or not enabled():
        return
    free, block, st = free_space(staged)
    if st.f_blocks == 0:
        log.info("%s reports no capacity; free space is not checked before the fetch", _existing(staged))
        return
    need = needed_bytes(todo, block=block, extra=extra, freed=freed) + reserve
    files = len(todo) + RECORD_BLOCKS  # the payloads' parts, the records and their temporaries
    also = f", and {size_text(reserve)} must stay free for {reserve_for}" if reserve else ""
    if need > free:
        raise InsufficientSpace(
            f"{staged} has {size_text(free)} free on its file system, and fetching {source} there needs "
            f"{size_text(need)}: {len(todo)} file(s) not yet verified in the stage{also}; nothing was written",
            remedy=f"free at least {size_text(need - free)} on the file system of {_existing(staged)}, or stage on a "
            "larger one (CKPTFLOW_SPACE_CHECK=0 skips this check where free space is understated)",
            path=str(staged), needed=need, free=free)
    if st.f_files and files > st.f_favail:
        raise InsufficientSpace(
            f"{staged} has {st.f_favail} free inodes on its file system, and fetching {source} there creates "
            f"{files} files; nothing was written",
            remedy=f"free inodes on the file system of {_existing(staged)} (remove files), or stage on another one",
            path=str(staged), needed=need, free=free)


def path_in(exc: OSError, staged: Path) -> str | None:
    """The stage-relative file an OS error names (a part's final file for a part), or None."""
    if not exc.filename:
        return None
    try:
        rel = PurePosixPath(Path(os.fsdecode(exc.filename)).relative_to(staged).as_posix())
    except ValueError:
        return None
    final = stage.part_of(rel.name)
    return str(rel.with_name(final)) if final is not None else str(rel)


def out_of_space(exc: OSError, staged: Path, written: str | None, unverified: list[FileEntry], *,
                 verified: int, freed: Iterable[Path] = ()) -> OutOfSpace:
    """The named failure for a disk that filled while ``written`` (a path in the stage) was being written.

    ``unverified`` are the files not in place yet (``freed``: their ``.part`` files a rerun resumes, kept),
    ``verified`` how many files this run already verified and kept.
    """
    free, block, _ = free_space(staged)
    need = needed_bytes(unverified, block=block, freed=freed)
    target = staged / written if written is not None else staged
    what = f"while {target} was being written" if written is not None else \
        f"while writing {', '.join(e.path for e in unverified) or 'the records'} into {staged}"
    return OutOfSpace(
        f"the file system of {staged} filled up {what} ({exc.strerror or exc}; another process may be writing "
        f"to it): {size_text(free)} free now, {len(unverified)} file(s) with {size_text(need)} still to write; "
        f"the {verified} file(s) verified by this run are in place and a partial download a rerun can resume "
        "from is kept in its .part",
        remedy=f"free at least {size_text(max(need - free, block))} on the file system of {_existing(staged)}, "
        "then rerun the same command (it resumes), or stage on a larger one",
        path=str(target), needed=need, free=free)
