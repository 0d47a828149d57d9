"""File-system primitives every step relies on: atomic writes, safe relative paths, no-symlink walks,
process-tagged temporaries and which of them are dead (``dead_temporaries``, ``InFlight``).

Why unique temporaries and renames instead of locks: ``flock`` is silently a no-op on some Lustre, GPFS
and NFS mounts, so correctness must come from names no other process can pick (pid + random suffix),
from ``os.replace`` being atomic within one directory, and from create-once records.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import hashlib
import os
import re
import secrets
import shutil
import socket
import stat
import threading
import unicodedata
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path, PurePosixPath

from .errors import NotFound, UnsafePath


def host_tag() -> str:
    """This host's short name as temporaries carry it (``node12`` for ``node12.cluster``)."""
    return socket.gethostname().split(".")[0] or "host"


def tagged_name(stem: str, suffix: str = "") -> str:
    """``<stem>.<host>.<pid>.<token><suffix>``: a name no other process or thread will choose."""
    return f"{stem}.{host_tag()}.{os.getpid()}.{secrets.token_hex(4)}{suffix}"


def unique_temp_path(path: Path, suffix: str = ".tmp") -> Path:
    """A sibling ``.<stem>.<host>.<pid>.<token><suffix>`` of ``path`` (see ``tagged_name``), ``<stem>``
    being ``temp_stem(path.name)``: the temporary of any name that fits the file system fits too."""
    return path.with_name(tagged_name(f".{temp_stem(path.name)}", suffix))


# Room a temporary name needs besides its stem: ".", a host label (at most 63), a pid, a token, a suffix.
_TEMP_OVERHEAD = 96


def temp_stem(name: str) -> str:
    """``name`` itself, or 16 hex digits of its SHA-256 when a temporary spelled after it could exceed
    ``NAME_MAX`` (a 247-byte shard name fits the file system, ``.<name>.<host>.<pid>...`` does not)."""
    if len(name.encode("utf-8", "surrogateescape")) <= NAME_MAX - _TEMP_OVERHEAD:
        return name
    return hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def parse_tagged_name(name: str, suffix: str = "") -> tuple[str, str, int] | None:
    """``(stem, host, pid)`` of a name built by ``tagged_name`` with this ``suffix``, else None."""
    m = _tagged_re(suffix).match(name)
    return (m["stem"], m["host"], int(m["pid"])) if m else None


@functools.cache
def _tagged_re(suffix: str) -> re.Pattern[str]:
    return re.compile(rf"^(?P<stem>.+)\.(?P<host>[^./]+)\.(?P<pid>[0-9]+)\.[0-9a-f]{{8}}{re.escape(suffix)}$")


def writer_gone(pid: int) -> bool:
    """Whether the process that named a temporary (``tagged_name`` embeds its pid) no longer runs.

    This very process is alive: its own temporaries may be in flight (another thread, an outer call),
    so it never treats them as dead by pid alone. Only meaningful on the host that wrote the name.
    """
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class InFlight:
    """The temporaries this process is using now, one registry per kind, shared by all its threads.

    Several calls may run in one process (threads, a library caller), and ``writer_gone`` can never call
    this process's own temporaries dead by pid: a caller that ``claim``s every temporary it writes and
    ``unclaim``s it when done passes ``snapshot()`` to ``dead_temporaries``, and its own temporaries
    outside the snapshot are then known to be idle leftovers of an earlier, failed call."""

    def __init__(self) -> None:
        self._paths: set[Path] = set()
        self._lock = threading.Lock()

    def claim(self, path: Path) -> None:
        with self._lock:
            self._paths.add(path)

    def unclaim(self, path: Path) -> None:
        with self._lock:
            self._paths.discard(path)

    def snapshot(self) -> frozenset[Path]:
        with self._lock:
            return frozenset(self._paths)


def dead_temporaries(
    directory: Path, stems: Iterable[str], suffix: str = "", *, kind: str = "file",
    in_flight: Collection[Path] | None = None,
) -> list[Path]:
    """Entries of ``directory`` named ``tagged_name(stem, suffix)`` for one of ``stems`` whose writer is gone.

    Only entries of ``kind`` (``"file"`` or ``"dir"``, never a symlink) written on this host count;
    another host's writer may still run. ``in_flight`` (an ``InFlight.snapshot()``): this process's own
    temporaries outside it are idle (left by an earlier, failed call) and count as dead too. Sorted by path.
    """
    stems, host = set(stems), host_tag()
    try:
        with os.scandir(directory) as it:
            entries = list(it)
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        parsed = parse_tagged_name(entry.name, suffix)
        if parsed is None or parsed[0] not in stems or parsed[1] != host:
            continue
        if not (entry.is_dir(follow_symlinks=False) if kind == "dir" else entry.is_file(follow_symlinks=False)):
            continue
        path, pid = Path(entry.path), parsed[2]
        idle_own = in_flight is not None and pid == os.getpid() and path not in in_flight
        if idle_own or writer_gone(pid):
            found.append(path)
    return sorted(found)


def fsync_dir(directory: Path) -> None:
    """Make a rename or create inside ``directory`` durable (best effort where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_temp(path: Path, data: bytes, mode: int, suffix: str = ".tmp") -> Path:
    """``data`` in a fresh, fsynced, uniquely named sibling of ``path``; removed again on failure."""
    tmp = unique_temp_path(path, suffix)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def payload_fsync_enabled() -> bool:
    """Whether large downloaded payloads are flushed to disk before they are committed (default: yes).

    The flush costs the time the disk needs to absorb the bytes (on the loopback benchmark it doubled
    the wall time of a download) and is what lets a copy marked complete survive a power loss.
    ``CKPTFLOW_FSYNC=0`` skips it for scratch staging that can be fetched again; records are always
    fsynced.
    """
    return os.environ.get("CKPTFLOW_FSYNC", "1").strip().lower() not in ("0", "false", "no", "off")


@functools.cache
def _sync_file_range():
    """libc's ``sync_file_range`` (Linux), or None where there is none."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (AttributeError, OSError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing the open file's dirty pages to disk now, without waiting
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``; nothing where unsupported). A writer that does other
    work between writes (hashing) then finds most of its bytes on disk at its ``fsync``, instead of all
    of them queued behind it. Durability still comes from the ``fsync``."""
    fn = _sync_file_range()
    if fn is not None:
        fn(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE over the whole file; a failure only loses the head start


def fsync_file(path: Path | str) -> None:
    """Flush a file's data to disk (before the rename that commits it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ioctl(dst, FICLONE, src): share src's extents copy-on-write (Btrfs, XFS with reflink, bcachefs, OCFS2).
FICLONE = 0x40049409
# What an ioctl or copy_file_range answers where the file system (or the pair of them) cannot do it.
_CANNOT = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS,
                     errno.EPERM, errno.EBADF})
COPY_CHUNK = 16 << 20


def clone_file(src: Path | str, dst: Path | str, *, on_created: Callable[[], None] | None = None) -> str:
    """Give ``dst`` (created here, exclusively: an existing path is never replaced) ``src``'s bytes in an
    inode of its own, fsynced; returns how: ``"reflink"`` (extents shared copy-on-write, no byte copied: a
    later write to either file leaves the other as it was), or ``"copy"`` (``copy_file_range`` in the
    kernel, which some file systems also answer by sharing extents, else read and write). A hard link is
    never the answer: it shares the inode, so a rewrite through the other name changes both.
    ``on_created`` runs right after ``dst`` exists, before its bytes come."""
    with open(src, "rb") as fin:
        st = os.fstat(fin.fileno())
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), stat.S_IMODE(st.st_mode))
        with os.fdopen(fd, "wb") as fout:
            if on_created is not None:
                on_created()
            how = _clone_into(fin, fout, st.st_size)
            fout.flush()
            os.fsync(fout.fileno())
    return how


def _clone_into(fin, fout, size: int) -> str:
    try:
        fcntl.ioctl(fout.fileno(), FICLONE, fin.fileno())
        return "reflink"
    except OSError as exc:
        if exc.errno not in _CANNOT:
            raise
    done = 0
    copy_range = getattr(os, "copy_file_range", None)
    while copy_range is not None and done < size:
        try:
            n = copy_range(fin.fileno(), fout.fileno(), min(size - done, 1 << 30), done, done)
        except OSError as exc:
            if exc.errno not in _CANNOT or done:
                raise
            break  # this pair of file systems has no in-kernel copy: read and write below
        if n == 0:
            break  # src is shorter than it was: copy what is there (the caller hashes what it copied)
        done += n
    if done == 0 or copy_range is None:
        fin.seek(0)
        fout.seek(0)
        shutil.copyfileobj(fin, fout, COPY_CHUNK)
    return "copy"


def atomic_write_bytes(path: Path | str, data: bytes, *, mode: int = 0o644, suffix: str = ".tmp") -> None:
    """Write ``data`` to ``path`` so that readers see either the old file or the complete new one.

    The temporary (``unique_temp_path(path, suffix)``) lives in the same directory (so the rename cannot
    cross file systems), is fsynced before the rename, and is removed if anything fails.
    """
    path = Path(path)
    tmp = _write_temp(path, data, mode, suffix)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def create_exclusive_bytes(path: Path | str, data: bytes, *, mode: int = 0o644) -> bool:
    """Publish ``data`` at ``path`` only if nothing is there; return False if it already exists.

    The bytes are written to a unique temporary first and then hard-linked into place: ``link`` fails
    with EEXIST atomically (also on NFS), so a reader never sees a partial file and two writers never
    both win.
    """
    path = Path(path)
    tmp = _write_temp(path, data, mode)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        fsync_dir(path.parent)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def safe_relpath(value: str, *, what: str = "path") -> PurePosixPath:
    """Validate a relative POSIX path taken from a record or a remote listing.

    Refuses empty paths, absolute paths, drive letters, backslashes, NUL, ``.`` and ``..`` segments, so
    the result can be joined to a directory without escaping it.
    """
    if not isinstance(value, str) or not value:
        raise UnsafePath(f"{what} {value!r} is empty or not a string", remedy="records must name files by a relative POSIX path")
    if "\x00" in value:
        raise UnsafePath(f"{what} {value!r} contains a NUL byte", remedy="the record is corrupt or hostile; do not use it")
    if "\\" in value:
        raise UnsafePath(f"{what} {value!r} contains a backslash", remedy="use POSIX '/' separators")
    if value.startswith("/") or (len(value) >= 2 and value[1] == ":"):
        raise UnsafePath(f"{what} {value!r} is absolute", remedy="records must use paths relative to their directory")
    parts = value.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise UnsafePath(
            f"{what} {value!r} has an empty, '.' or '..' segment",
            remedy="a path must stay inside its directory; the record is corrupt or hostile",
        )
    return PurePosixPath(value)


def resolve_inside(root: Path, relpath: str, *, what: str = "path") -> Path:
    """Join a validated relative path to ``root``; refuse if any existing component is a symlink."""
    rel = safe_relpath(relpath, what=what)
    current = Path(root)
    for part in rel.parts:
        current = current / part
        if current.is_symlink():
            raise UnsafePath(
                f"{what} {relpath!r} passes through the symlink {current}",
                remedy="artifacts must hold regular files only; replace the link by the file it points to",
            )
    return current


def require_directory(path: Path | str, what: str, remedy: str) -> Path:
    """``path`` as a Path when it is a directory, else ``NotFound`` naming it: "``what`` ``path`` does not
    exist" (or "is not a directory") and ``remedy``. The one wording every verb uses for a path that
    was mistyped, so a typo is never reported as a missing receipt or a fresh start."""
    path = Path(path)
    if not os.path.lexists(path):
        raise NotFound(f"{what} {path} does not exist", remedy=remedy, path=str(path))
    if not path.is_dir():
        raise NotFound(f"{what} {path} is not a directory", remedy=remedy, path=str(path))
    return path


def walk_files(root: Path) -> Iterator[str]:
    """Yield every regular file under ``root`` as a sorted relative POSIX path; refuse symlinks.

    Anything that is not a directory or a regular file (symlink, socket, device) is an error naming it,
    because an artifact made of links cannot be proven to hold its own bytes.
    """
    root = Path(root)
    if root.is_symlink():
        raise UnsafePath(f"{root} is a symlink", remedy="point ckptflow at the real directory")
    if not root.is_dir():
        raise NotFound(f"directory {root} does not exist", remedy="check the path")
    yield from _walk(root, PurePosixPath())


def _walk(root: Path, prefix: PurePosixPath) -> Iterator[str]:
    with os.scandir(root / prefix) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = prefix / entry.name
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePath(
                f"{root / rel} is a symlink",
                remedy="artifacts must hold regular files only; replace the link by the file it points to",
            )
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(root, rel)
        elif stat.S_ISREG(st.st_mode):
            yield rel.as_posix()
        else:
            raise UnsafePath(f"{root / rel} is not a regular file", remedy="remove it from the artifact directory")


# --------------------------------------------------------------------------------------------- names

# Bytes per path component on ext4, XFS, Btrfs, Lustre, GPFS and NFS; the bound seal and publish hold
# every artifact name to, so that fetch can write it back on any of them.
NAME_MAX = 255


def name_max(directory: Path | str) -> int:
    """The longest file name (bytes) the file system of ``directory`` or its nearest existing ancestor takes."""
    path = Path(os.path.abspath(directory))
    while not path.exists() and path.parent != path:
        path = path.parent
    try:
        return int(os.pathconf(path, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return NAME_MAX


def restorable_name_problem(paths: list[str], limit: int = NAME_MAX) -> str | None:
    """Why a set of relative POSIX paths could not all be written back to a directory, or None.

    A name (any component) longer than ``limit`` bytes in UTF-8 cannot be created; two paths that are
    equal after Unicode NFC normalisation and case folding (``Model.pt`` and ``model.pt``, or a file
    ``A`` and a directory ``a/``) land on one file on case-insensitive or normalising file systems.
    """
    seen: dict[str, str] = {}
    for path in sorted(paths):
        parts = PurePosixPath(path).parts
        for i, part in enumerate(parts):
            size = len(part.encode("utf-8", "surrogateescape"))
            if size > limit:
                return (f"{path!r} has a name of {size} bytes ({part[:24]}...), over the file-system limit of "
                        f"{limit} bytes per name (NAME_MAX)")
            spelled = "/".join(parts[: i + 1])
            key = _fold(spelled)
            other = seen.setdefault(key, spelled)
            if other != spelled:
                return (f"{other!r} and {spelled!r} are one name on case-insensitive or Unicode-normalising "
                        "file systems (equal after NFC and case folding)")
    return None


def _fold(path: str) -> str:
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", path).casefold())
