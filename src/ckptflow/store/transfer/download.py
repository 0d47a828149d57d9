"""Concurrent ranged downloads, hashed in order as they arrive (one pass, no re-read).

``download_ranges``: each worker reads its range into a page-aligned buffer and writes it with
``O_DIRECT`` straight to the disk; the finished buffer goes to a hashing thread in file order. It
returns the ``FileDigest`` of the whole file (a verified prefix is accounted for by a pre-fed hasher).
Writing through the page cache was where a download's CPU went: copying into freshly allocated cache
pages cost 3-7 CPU-s per GiB on a VM (more than receiving and hashing together), and those pages had
to be flushed again before the file could be committed. Where ``O_DIRECT`` is refused (or
``CKPTFLOW_DIRECT_IO=0``), each worker writes every received piece through the page cache at once,
while it is still in the CPU cache. A killed download leaves holes, which ``archive.stage`` accounts
for when it resumes. ``download_batch`` runs several files as one stream, so no file boundary leaves
the connections idle, and commits each file on a thread of its own. A file with part digests
(``RangedFile.parts``) is not hashed in order at all: its ranges are whole parts, and the worker that
received a range checks its parts (BLAKE3, on at most ``digest.hash_threads()`` threads at once) before
it writes them; a range that fails is read once more, and a second failure fails the download naming the
byte range. Progress is counted when a range
has been written, so retries never count twice. Backends supply ``open_range(offset, length)`` (a
context manager yielding an object with ``readinto``).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import mmap
import os
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...digest import FileDigest, PartDigests, sha256_prefix
from ...errors import UnsafePath, VerificationFailed
from ...progress import ByteProgress
from ..base import RangeReader
from .stream import (
    BUFFERS,
    DEFAULT_RANGE_SIZE,
    IO_PIECE,
    BatchFile,
    check_parts,
    open_stream,
    ranges_of,
    read_range,
)

# O_DIRECT writes need offsets, lengths and buffers aligned to the device's logical block (512 or 4096).
ALIGN = 4096
# With O_DIRECT a range is read whole before it is written; the body is read in pieces of this size.
READ_PIECE = 1024 * 1024


def _hash_prefix(fd: int, length: int, dest: Path) -> Any:
    """Hash the first ``length`` bytes already in ``dest`` (when resuming without a pre-fed hasher)."""
    h = sha256_prefix(fd, length)
    if h is None:
        raise VerificationFailed(f"{dest} holds {os.fstat(fd).st_size} bytes, fewer than the resume offset {length}",
                                 remedy="delete the partial file and download again", path=str(dest))
    return h


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    written = 0
    while written < len(view):
        written += os.pwrite(fd, view[written:], offset + written)


class FileRange:
    """``open_range`` for a local file descriptor: ``readinto`` with ``os.preadv`` from ``offset``."""

    def __init__(self, fd: int, offset: int, length: int):
        self._fd, self._pos, self._end = fd, offset, offset + length

    def readinto(self, view: memoryview) -> int:
        want = min(len(view), self._end - self._pos)
        if want <= 0:
            return 0
        n = os.preadv(self._fd, [view[:want]], self._pos)
        self._pos += n
        return n

    @classmethod
    def opener(cls, fd: int) -> Callable[[int, int], AbstractContextManager[RangeReader]]:
        return lambda offset, length: contextlib.nullcontext(cls(fd, offset, length))


@dataclass
class RangedFile:
    """One file of a ``download_batch``: fill bytes ``[start, size)`` of ``dest`` from ``open_range``.

    ``open_range(offset, length)`` yields a reader of exactly that span. ``hasher`` must already hold
    bytes ``[0, start)``; without one they are re-read from ``dest``. ``progress.update(n)`` is told
    each range once it is written; ``source`` names the object in errors. With ``parts`` (the file's
    declared part digests) every range is checked part by part instead, ``start`` must be a part boundary
    whose prefix the caller verified, and no hasher is used.
    """

    dest: Path
    size: int
    open_range: Callable[[int, int], AbstractContextManager[RangeReader]]
    start: int = 0
    hasher: Any = None
    progress: Any = None
    source: str = "object"
    parts: PartDigests | None = None


class _Target(BatchFile):
    """A ``RangedFile`` being written; truncated to its start when first opened.

    Besides the ordinary descriptor it holds one opened with ``O_DIRECT`` where the filesystem allows
    it (``CKPTFLOW_DIRECT_IO=0`` turns that off): whole ranges go from the worker's page-aligned buffer
    to the disk without a copy into the page cache (see the module docstring); bytes outside whole
    aligned blocks (an unaligned resume offset, a file's tail) go through the ordinary descriptor.
    """

    def __init__(self, spec: RangedFile):
        super().__init__()
        self.spec = spec
        self.hasher = spec.hasher
        self.direct: int | None = None

    def _open_first(self) -> int:
        fd, have = _open_target(self.spec)
        try:
            if self.hasher is None and self.spec.parts is None:
                self.hasher = _hash_prefix(fd, self.spec.start, self.spec.dest) if self.spec.start else hashlib.sha256()
            # Only when there is something to cut: on ext4 a truncate to size 0, even of an empty new file,
            # marks the file to be flushed when it is closed (auto_da_alloc), which cost a 1 GiB download
            # 0.3 s of writeback inside the transfer.
            if have != self.spec.start:
                os.ftruncate(fd, self.spec.start)
            self.direct = _open_direct(self.spec.dest, fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def write(self, fd: int, view: memoryview, offset: int) -> None:
        """Write ``view`` at ``offset``: its whole aligned blocks through ``O_DIRECT`` where open."""
        direct = self.direct
        if direct is None:
            _pwrite_all(fd, view, offset)
            return
        head = min(len(view), -offset % ALIGN)
        body = (len(view) - head) // ALIGN * ALIGN
        if head:
            _pwrite_all(fd, view[:head], offset)
        if body:
            try:
                _pwrite_all(direct, view[head:head + body], offset + head)
            except OSError as exc:
                if exc.errno != errno.EINVAL:  # a device with larger blocks than ALIGN: no direct writes
                    raise
                self.direct = None
                _pwrite_all(fd, view[head:head + body], offset + head)
        if head + body < len(view):
            _pwrite_all(fd, view[head + body:], offset + head + body)

    def close(self) -> None:
        with self._lock:
            if self.direct is not None:
                os.close(self.direct)
                self.direct = None
        super().close()


def _direct_io_enabled() -> bool:
    return hasattr(os, "O_DIRECT") and os.environ.get("CKPTFLOW_DIRECT_IO", "1") != "0"


def _open_direct(dest: Path, fd: int) -> int | None:
    """A second descriptor of the file open as ``fd``, with ``O_DIRECT``; None where it cannot be had."""
    if not _direct_io_enabled():
        return None
    try:
        direct = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_DIRECT)
    except OSError:  # no /proc, or a filesystem without O_DIRECT (tmpfs before Linux 6.6, some FUSE)
        return None
    if os.path.samestat(os.fstat(direct), os.fstat(fd)):
        return direct
    os.close(direct)
    return None


def _open_target(spec: RangedFile) -> tuple[int, int]:
    """The target opened for writing (never through a symlink) and the bytes it holds."""
    try:
        fd = os.open(spec.dest, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"download target {spec.dest} is a symlink", remedy="remove the link; ckptflow writes "
                             "only regular files it created") from None
        raise
    have = os.fstat(fd).st_size
    if have < spec.start:
        os.close(fd)
        raise VerificationFailed(f"{spec.dest} holds {have} bytes, fewer than the resume offset {spec.start}",
                                 remedy="delete the partial file and download again", path=str(spec.dest))
    return fd, have


def _fill(target: _Target, fd: int, offset: int, view: memoryview) -> None:
    """Read the range at ``offset`` into ``view`` and write it: piece by piece through the page cache, or
    whole through ``O_DIRECT`` once it is complete (and its parts checked). A failed write (a full disk)
    names the file written."""
    try:
        _fill_range(target, fd, offset, view)
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(target.spec.dest)
        raise


def _fill_range(target: _Target, fd: int, offset: int, view: memoryview) -> None:
    filled = 0
    direct = target.direct is not None
    with target.spec.open_range(offset, len(view)) as reader:
        while filled < len(view):
            n = reader.readinto(view[filled:filled + (READ_PIECE if direct else IO_PIECE)])
            if not n:
                break
            if not direct:  # through the page cache: written while the piece is in the CPU cache
                _pwrite_all(fd, view[filled:filled + n], offset + filled)
            filled += n
    if filled != len(view):
        raise VerificationFailed(
            f"{target.spec.source} returned {filled} bytes for the range at {offset}, expected {len(view)}",
            remedy="the source is shorter than its recorded size; check it")
    if target.spec.parts is not None:  # before an O_DIRECT write; a piecewise write is rewritten on a retry
        check_parts(target.spec.parts, offset, view, target.spec.source)
    if direct:
        target.write(fd, view, offset)


def download_batch(files: Sequence[RangedFile], *, concurrency: int = 8, range_size: int = DEFAULT_RANGE_SIZE,
                   finish: Callable[[int, FileDigest], None] | None = None) -> list[FileDigest]:
    """Download ``files`` as one stream of ranges; return each whole file's ``FileDigest``, in order.

    The ranges of all files form one ordered stream, so the next file's first ranges start while the
    previous file's last ones are still in flight and no file boundary leaves the connections idle.
    Each worker reads its range into a reused page-aligned buffer and writes it whole with ``O_DIRECT``
    (or, where that is refused, writes every piece through the page cache at once, while it is still in
    the CPU cache); finished ranges reach one hashing thread in stream order, so each
    file is hashed in order and no byte is read back. A range whose reader raises ``TransientRead`` is
    fetched again (four attempts in all); one that ends early fails the download naming its source.

    When a file's last range is hashed, ``finish(index, digest)`` runs on a commit thread (the caller's
    verify / fsync / rename; several files' commits may run at once, in any order) while later files
    keep downloading. The first failure, of a
    range or of ``finish``, stops the stream once the running work has returned and is raised; files
    whose ``finish`` completed stay as it left them. Files are not fsynced here. A file with ``parts`` is
    checked range by range by its workers (see the module docstring) and its digest is the declared one.
    """
    targets = [_Target(f) for f in files]
    items: list[tuple[int, int, int, bool]] = []
    for i, spec in enumerate(files):
        if not 0 <= spec.start <= spec.size:
            raise ValueError(f"resume offset {spec.start} is outside 0..{spec.size} for {spec.dest}")
        spans = ranges_of(spec.start, spec.size, range_size, spec.parts) or [(spec.start, 0)]  # an empty rest still creates it
        items += [(i, off, n, k == len(spans) - 1) for k, (off, n) in enumerate(spans)]
    digests: list[FileDigest | None] = [None] * len(files)

    def work(item: tuple[int, int, int, bool]) -> tuple[mmap.mmap, memoryview] | None:
        i, offset, length, _ = item
        fd = targets[i].open()
        if not length:
            return None
        # The range sits in the page-aligned buffer at the offset's own alignment, so every aligned block
        # of the file is an aligned address in memory too (as O_DIRECT needs), even after a resume.
        shift = offset % ALIGN
        buf = BUFFERS.take(shift + length, aligned=True)
        view = memoryview(buf)[shift:shift + length]
        try:
            read_range(lambda: _fill(targets[i], fd, offset, view), checked=targets[i].spec.parts is not None)
        except BaseException:
            view.release()
            BUFFERS.give(buf)
            raise
        return buf, view

    with open_stream(targets, concurrency) as stream:
        def complete(i: int) -> None:  # on the hashing thread, after the file's last bytes
            parts = files[i].parts  # every range checked: the declared bytes
            digests[i] = FileDigest(files[i].size, parts.sha256 if parts is not None else targets[i].hasher.hexdigest())
            if finish is not None:
                stream.commit(finish, i, digests[i])

        def consume(item: tuple[int, int, int, bool], got: tuple[mmap.mmap, memoryview] | None) -> None:
            i, _, length, last = item
            target = targets[i]
            if got is not None:
                buf, view = got
                if target.spec.parts is not None:  # checked by its worker already
                    view.release()
                    BUFFERS.give(buf)
                else:
                    stream.hashing.submit(target.hasher.update, view, after=lambda: BUFFERS.give(buf))
                if target.spec.progress is not None:
                    target.spec.progress.update(length)
            if last:
                target.close()  # every range of it is written: they are consumed in order
                stream.hashing.submit(complete, i)

        stream.run(items, work, consume, "download", concurrency)
    assert all(d is not None for d in digests)
    return digests  # type: ignore[return-value]


def download_ranges(dest: Path, *, size: int, open_range: Callable[[int, int], AbstractContextManager[RangeReader]],
                    start: int = 0, hasher=None, concurrency: int = 8, range_size: int = DEFAULT_RANGE_SIZE,
                    progress: ByteProgress | None = None, source: str = "object") -> FileDigest:
    """Fill bytes ``[start, size)`` of ``dest`` from ``open_range`` and return the whole file's digest.

    One file of ``download_batch`` (see there). ``dest`` is created if absent (a symlink is refused,
    never followed) and truncated to ``start`` (bytes past the verified prefix are rewritten). It is not
    fsynced: callers that commit the file (fetch staging) flush it before the rename that makes it count.
    """
    [digest] = download_batch([RangedFile(Path(dest), size, open_range, start, hasher, progress, source)],
                              concurrency=concurrency, range_size=range_size)
    return digest
