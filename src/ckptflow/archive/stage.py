"""The local side of fetch: a staging directory ``STAGE/iter_N`` and what in it belongs to ckptflow.

Ownership comes from the record ``.staged.json`` alone (``records/staging.py``): a directory holding
anything without it is foreign and is never written to; with it, only the paths the record names are
this tool's to replace or remove. Everything here either inspects (and refuses by name) or acts on
owned paths only; ``reader.fetch_artifact`` decides the order.

Downloads go through ``.part`` temporaries named ``.<name>.<host>.<pid>.<token>.part`` beside their
final file (``fsutil.unique_temp_path``; a name too long for that is replaced by 16 hex digits of its
SHA-256, ``fsutil.temp_stem``, so any name that fits the file system can be written). Unique per
process without a lock, because ``flock`` is
silently a no-op on some Lustre/GPFS/NFS mounts. A part whose writer is gone (same host, dead pid) is
a *leftover*; the part a resumed fetch continues from is one of those, renamed to the new process's
own name first so that two resuming processes never write the same file.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

from ..digest import FileDigest, sha256_file, sha256_prefix, verified_part_prefix
from ..errors import ConflictError, InvalidRecord, Refused, UnsafePath
from ..fsutil import (
    InFlight,
    dead_temporaries,
    fsync_dir,
    parse_tagged_name,
    resolve_inside,
    temp_stem,
    unique_temp_path,
)
from ..lock import held_lock
from ..records import staging as staging_record
from ..records.inventory import FileEntry

log = logging.getLogger(__name__)


@contextlib.contextmanager
def stage_lock(staged: Path, wait_seconds: float) -> Iterator[Path | None]:
    """Hold ``STAGE/iter_N.lock`` (``ckptflow.lock``) while one fetch plans and writes ``staged``; wait up to
    ``wait_seconds`` for another fetch, then refuse naming it. Yields the lock's path (None when a test
    disabled it: ``fetch:lock``)."""
    with held_lock(staged.with_name(staged.name + ".lock"), wait_seconds, step="fetch",
                   busy=f"{staged} is being fetched into by another request",
                   remedy="let that fetch finish, then rerun (it answers already-staged once the copy is "
                   "complete), or raise --lock-wait-seconds") as path:
        yield path

PART_SUFFIX = ".part"
# A resumed part restarts at the end of its first hole rounded down to this, so a block that a killed
# write left half-filled is never trusted as data (see ``resumable_prefix``).
PREFIX_ALIGN = 1024 * 1024

_writing = InFlight()  # parts this process is writing now (several fetches may share a process)


def is_part_name(name: str) -> bool:
    """True for a file name shaped like this tool's download temporaries."""
    return part_of(name) is not None


def part_of(name: str) -> str | None:
    """The name of the file a download temporary named ``name`` is a part of, or None."""
    parsed = parse_tagged_name(name, PART_SUFFIX)
    return parsed[0][1:] if parsed is not None and parsed[0].startswith(".") else None


# --------------------------------------------------------------------------------------------- parts


def new_part(final: Path) -> Path:
    """A fresh, process-unique temporary beside ``final``, registered as being written."""
    part = unique_temp_path(final, PART_SUFFIX)
    _writing.claim(part)
    return part


def unclaim_part(part: Path) -> None:
    """This process no longer writes ``part``: if it is still there, ``leftover_parts`` lists it from now on."""
    _writing.unclaim(part)


def leftover_parts(final: Path) -> list[Path]:
    """Parts of ``final`` whose writer is gone: this host, a dead pid (or ours, no longer active).

    Parts written on another host are left alone: their writer may still be running.
    """
    # A part is named after the file's stem (``fsutil.temp_stem``), or after its whole name as earlier
    # versions spelled every part.
    return dead_temporaries(final.parent, {f".{temp_stem(final.name)}", f".{final.name}"}, PART_SUFFIX,
                            in_flight=_writing.snapshot())


def resumable_prefix(part: Path, size: int) -> int:
    """How many leading bytes of ``part`` are worth re-verifying: data up to its first hole.

    Ranges are written concurrently, so a killed download leaves holes; ``SEEK_HOLE`` finds the end of
    the contiguous data from offset 0 and the bound is rounded down to ``PREFIX_ALIGN``. The bytes are
    never trusted on this: the caller hashes them into the file's digest and checks the whole file
    against the declared sha256 at the end. Where ``SEEK_HOLE`` is not supported the whole length
    counts; a wrong guess then costs one re-download, never a wrong file.
    """
    try:
        fd = os.open(part, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return 0
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > size:
            return 0
        try:
            bound = min(st.st_size, os.lseek(fd, 0, os.SEEK_HOLE))
        except OSError:
            bound = st.st_size
    finally:
        os.close(fd)
    return bound if bound == size else bound - bound % PREFIX_ALIGN


def claim_part(final: Path, size: int) -> tuple[Path, int]:
    """A part to download ``final`` into and the offset to resume at (0: from the start).

    The leftover with the longest usable prefix is renamed to this process's own name; the other
    leftovers of ``final`` (also this tool's, by name and dead writer) are removed.
    """
    leftovers = leftover_parts(final)
    best = max(leftovers, key=lambda p: resumable_prefix(p, size), default=None)
    part = new_part(final)
    offset = 0
    if best is not None and (offset := resumable_prefix(best, size)) > 0:
        try:
            os.rename(best, part)
        except FileNotFoundError:  # another resuming process took it first
            offset = 0
    for other in leftovers:
        if other != best or offset == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(other)
    return part, offset


def hash_prefix(part: Path, length: int):
    """A sha256 fed with the first ``length`` bytes of ``part`` (re-read, never trusted from before)."""
    with open(part, "rb", buffering=0) as fh:
        return sha256_prefix(fh.fileno(), length)


def verified_prefix(part: Path, length: int, parts) -> int:
    """How much of ``part``'s first ``length`` bytes a download with part digests resumes after: the
    whole parts from its start whose BLAKE3 matches (re-read, never trusted from before)."""
    with open(part, "rb", buffering=0) as fh:
        return verified_part_prefix(fh.fileno(), parts, length)


def write_via_part(final: Path, data: bytes) -> None:
    """Write small bytes (the manifest) the way payloads are written: part, fsync, rename."""
    part = new_part(final)
    try:
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(part, final)
        fsync_dir(final.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
        unclaim_part(part)


# --------------------------------------------------------------------------------------------- ownership


def read_own_record(staged: Path) -> staging_record.StagingRecord | None:
    """The record of this tool's copy in ``staged``; None when ``staged`` is absent or an empty directory.

    Refuses (touching nothing) a path that is not a directory, a directory holding anything without
    ``.staged.json`` (foreign), and a record that cannot be read (ownership then cannot be proven).
    """
    if not os.path.lexists(staged):
        return None
    if staged.is_symlink() or not staged.is_dir():
        raise Refused(f"{staged} exists and is not a directory", remedy="choose another --dst or move it away")
    record_path = staging_record.path_in(staged)
    if not os.path.lexists(record_path):
        with os.scandir(staged) as it:
            if next(it, None) is None:
                return None
        raise Refused(
            f"{staged} holds files but no {staging_record.FILENAME}: it was not written by ckptflow fetch",
            remedy="ckptflow never replaces or deletes files it did not write; choose another --dst or move it away",
        )
    if record_path.is_symlink():
        raise Refused(f"{record_path} is a symlink", remedy="ckptflow writes its records itself; move the directory away")
    try:
        return staging_record.read_staging(staged)
    except (InvalidRecord, OSError) as exc:
        raise Refused(
            f"{record_path} cannot be read ({exc}), so which files in {staged} ckptflow wrote cannot be proven",
            remedy="move the directory aside (nothing in it was changed) or choose another --dst",
        ) from None


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None


def check_room(staged: Path, paths: Iterable[str], owned: set[str]) -> None:
    """Refuse when something ckptflow did not write stands where the artifact needs a file or directory.

    ``owned`` are the paths of this tool's record (an own file standing where a directory is needed is
    removed before the download, in a replacement). Symlinks inside the stage are refused by
    ``resolve_inside``. Read-only.
    """
    paths = sorted(paths)
    dirs = sorted({d.as_posix() for p in paths for d in PurePosixPath(p).parents if d.as_posix() != "."})
    for rel in dirs:
        st = _lstat(resolve_inside(staged, rel, what=f"staged directory {rel}"))
        if st is not None and not stat.S_ISDIR(st.st_mode) and rel not in owned:
            raise ConflictError(
                f"{staged / rel} is in the way: the artifact needs a directory there and ckptflow did not write it",
                remedy="move it elsewhere or choose another --dst; ckptflow never deletes files it did not write",
            )
    for rel in paths:
        target = resolve_inside(staged, rel, what=f"staged file {rel}")
        st = _lstat(target)
        if st is None:
            continue
        if rel not in owned:
            raise ConflictError(
                f"{target} is in the way: the artifact has a file there and ckptflow did not write this one",
                remedy="move it elsewhere or choose another --dst; ckptflow never deletes files it did not write",
            )
        if not stat.S_ISREG(st.st_mode):
            raise ConflictError(
                f"{target} is no longer the regular file ckptflow wrote there",
                remedy="move it elsewhere or choose another --dst",
            )


def check_removable(staged: Path, entries: Iterable[FileEntry]) -> None:
    """Before a replacement removes anything: each recorded path is absent or a regular file. Read-only."""
    for entry in entries:
        target = resolve_inside(staged, entry.path, what=f"recorded file {entry.path}")
        st = _lstat(target)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise ConflictError(
                f"{target} is named in {staging_record.FILENAME} but is no longer a regular file",
                remedy="move it elsewhere or choose another --dst; ckptflow removes only the files it wrote",
            )


def file_key(path: Path) -> tuple | None:
    """The state a file is judged in: (device, inode, size, mtime) of the path itself; None when absent."""
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def unlink_if_judged(path: Path, judged: tuple | None) -> bool:
    """Remove ``path`` only while it is still the file judged (``file_key``); True when removed.

    Fetches into one stage hold its lock, but ``flock`` may be a no-op on a cluster file system: a
    file another fetch renamed into place since the judgement is a new inode and is kept.
    """
    if judged is None or file_key(path) != judged:
        return False
    try:
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def clear_unverified(staged: Path, entry: FileEntry, judged: tuple | None) -> bool:
    """Before downloading ``entry`` into an own copy of the same source: remove the file judged not to
    match, unless it changed since; a file that appeared or changed meanwhile is judged again (hashed).
    Returns True when what stands there now verifies (nothing to download)."""
    target = staged / entry.path
    now = file_key(target)
    if now is None:
        return False
    if now == judged:
        log.warning("%s does not match the archive; downloading it again", target)
        unlink_if_judged(target, judged)  # owned: named in this tool's record for this very source
        return False
    if now[2] == entry.size and sha256_file(target) == FileDigest(entry.size, entry.sha256) \
            and file_key(target) == now:
        log.info("%s was completed by another fetch meanwhile and verifies; kept", target)
        return True
    if unlink_if_judged(target, now):
        log.warning("%s changed since it was judged and does not match the archive; downloading it again", target)
        return False
    raise ConflictError(f"{target} keeps changing while this fetch runs", path=str(target),
                        remedy="let the other writer finish, then rerun the fetch")


def remove_recorded_files(staged: Path, entries: Iterable[FileEntry],
                          judged: dict[str, tuple | None] | None = None) -> list[str]:
    """Remove the files ``entries`` name (and their leftover parts), then directories left empty.

    With ``judged`` (path -> ``file_key`` when the caller decided), a file is removed only while it is
    still the one judged; one that changed meanwhile is kept."""
    removed: list[str] = []
    for entry in entries:
        target = resolve_inside(staged, entry.path, what=f"recorded file {entry.path}")
        for part in leftover_parts(target):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
        if judged is not None:
            if unlink_if_judged(target, judged.get(entry.path)):
                removed.append(entry.path)
            continue
        try:
            os.unlink(target)
            removed.append(entry.path)
        except (FileNotFoundError, NotADirectoryError):
            pass
    dirs = {d for e in entries for d in PurePosixPath(e.path).parents if d.as_posix() != "."}
    for d in sorted(dirs, key=lambda p: -len(p.parts)):
        try:
            os.rmdir(staged / d)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT, errno.ENOTDIR):
                raise
    fsync_dir(staged)
    return sorted(removed)


def remove_own_copy(staged: Path) -> list[str]:
    """Remove this tool's copy in ``staged``: the files its record names (and their leftover parts), then
    the record and ``staged`` itself when nothing else is in it. Returns what is left, which ckptflow did
    not write (a directory without a readable record is left whole)."""
    if not os.path.lexists(staged):
        return []
    try:
        record = read_own_record(staged)
    except Refused:
        return unowned_files(staged, set()) or ["."]
    if record is not None:
        remove_recorded_files(staged, record.files)
        left = unowned_files(staged, {e.path for e in record.files})
        if left:
            return left
        os.unlink(staging_record.path_in(staged))
    try:
        os.rmdir(staged)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        return unowned_files(staged, set()) or sorted(os.listdir(staged))
    return []


def files_in_place(staged: Path, entries: Iterable[FileEntry]) -> bool:
    """Every entry is a regular file of its recorded size (what a complete copy is trusted on)."""
    for entry in entries:
        try:
            st = _lstat(resolve_inside(staged, entry.path, what=f"staged file {entry.path}"))
        except UnsafePath:
            return False
        if st is None or not stat.S_ISREG(st.st_mode) or st.st_size != entry.size:
            return False
    return True


def unowned_files(staged: Path, owned: set[str]) -> list[str]:
    """Everything in ``staged`` ckptflow did not write (user files, foreign parts), sorted; nothing followed."""
    out: list[str] = []
    stems = {f"{PurePosixPath(p).parent.as_posix()}/{temp_stem(PurePosixPath(p).name)}".removeprefix("./")
             for p in owned}

    def walk(directory: Path, prefix: str) -> None:
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                walk(Path(entry.path), rel + "/")
                continue
            final = part_of(entry.name)
            mine = final is not None and (f"{prefix}{final}" in owned or f"{prefix}{final}" in stems)
            if rel not in owned and rel != staging_record.FILENAME and not mine:
                out.append(rel)

    if staged.is_dir():
        walk(staged, "")
    return out
