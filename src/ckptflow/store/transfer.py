"""Backend-neutral transfer machinery: concurrent ranged downloads and part uploads, hashed in order.

Both directions run byte ranges on a thread pool and hand each finished range to the calling thread in
*file order*, where it is hashed. A range that finishes early waits in memory until the ranges before
it are hashed; at most ``concurrency`` ranges are in flight and ``2 × concurrency`` in flight or
waiting, so memory stays below about ``2 × concurrency × range size`` while the file is read or written
exactly once:

- ``download_ranges``: each worker streams its range into a buffer in small pieces and writes every
  piece to the file at once, while the bytes are still in the CPU cache; the finished buffer goes to a
  hashing thread in file order. It returns the ``FileDigest`` of the whole file (a verified prefix is
  accounted for by a pre-fed hasher). A killed download leaves holes, which ``archive.stage`` accounts
  for when it resumes.
- ``upload_batch`` reads each part into a buffer with ``os.preadv`` and gives each file's commit the
  parts' results plus the sha256 of the bytes actually sent, so a file that changed after it was
  hashed is caught before its upload is committed.

Both run several files as one stream (``download_batch`` / ``upload_batch``), so no file boundary
leaves the connections idle, and commit each file on a thread of their own.

Buffers are reused (``BufferCache``): a fresh multi-MiB allocation per range is an ``mmap`` that is
page-faulted and zeroed on first touch and unmapped (a TLB shoot-down across threads) when freed,
which costs more CPU than hashing the range.

Progress is counted when a range has been written or a part acknowledged, so retries never count twice.
Backends supply ``open_range(offset, length)`` (a context manager yielding an object with
``readinto``) and ``upload_part(number, data)``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from ..digest import FileDigest, sha256_prefix
from ..errors import StoreError, UnsafePath, VerificationFailed
from ..progress import ByteProgress

DEFAULT_RANGE_SIZE = 8 * 1024 * 1024
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
MAX_PARTS = 10_000
# A worker writes what it received in pieces of this size, while they are still in the CPU cache.
IO_PIECE = 256 * 1024
MiB = 1024 * 1024

T = TypeVar("T")
R = TypeVar("R")


def split_ranges(start: int, end: int, range_size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` pieces covering ``[start, end)``; empty when ``start == end``."""
    if range_size <= 0:
        raise ValueError("range_size must be positive")
    return [(off, min(range_size, end - off)) for off in range(start, end, range_size)]


def part_size_for(size: int, part_size: int) -> int:
    """``part_size`` grown (to a whole MiB) just enough that ``size`` fits in ``MAX_PARTS`` parts."""
    needed = -(-size // MAX_PARTS)
    if needed <= part_size:
        return part_size
    mib = 1024 * 1024
    return -(-needed // mib) * mib


def retry_call(fn: Callable[[], T], *, retry_on: tuple[type[BaseException], ...], attempts: int = 4,
               base_delay: float = 0.1, max_delay: float = 2.0) -> T:
    """Call ``fn``; on one of ``retry_on`` wait (exponential backoff) and try again, ``attempts`` in all."""
    for attempt in range(attempts):
        try:
            return fn()
        except retry_on:
            if attempt == attempts - 1:
                raise
            time.sleep(min(max_delay, base_delay * (2 ** attempt)))
    raise AssertionError("unreachable")


def ordered_map(items: Sequence[T], work: Callable[[T], R], consume: Callable[[T, R], None], *,
                concurrency: int, name: str = "transfer", window: int | None = None) -> None:
    """Run ``work`` on a pool and call ``consume`` in the calling thread, strictly in ``items`` order.

    At most ``concurrency`` items run at once and at most ``window`` (default ``2 * concurrency``) are
    running or finished-but-unconsumed: the slack keeps every worker busy while one slow item holds up
    the in-order consumer, and bounds memory to ``window`` results (pass a larger window when results
    are small). The first failure cancels what has not started, waits for what is running, and
    propagates.
    """
    if not items:
        return
    window = max(window or 0, 2 * max(1, concurrency))
    futures: dict[int, Future[R]] = {}
    next_submit = next_consume = 0
    with ThreadPoolExecutor(max_workers=min(max(1, concurrency), len(items)), thread_name_prefix=name) as pool:
        try:
            while next_consume < len(items):
                while next_submit < len(items) and next_submit - next_consume < window:
                    futures[next_submit] = pool.submit(work, items[next_submit])
                    next_submit += 1
                if not futures[next_consume].done():
                    running = [f for f in futures.values() if not f.done()]
                    wait(running, return_when=FIRST_COMPLETED)
                for fut in futures.values():
                    if fut.done() and fut.exception() is not None:
                        raise fut.exception()
                while next_consume in futures and futures[next_consume].done():
                    consume(items[next_consume], futures.pop(next_consume).result())
                    next_consume += 1
        except BaseException:
            for fut in futures.values():
                fut.cancel()
            raise


class TransientRead(StoreError):
    """A range's body broke off mid-stream; the whole range is fetched again."""


class RangeReader(Protocol):
    def readinto(self, view: memoryview, /) -> int: ...


class BufferCache:
    """Reusable byte buffers for ranges and parts, kept while a transfer session is open.

    ``take(n)`` returns a ``bytearray`` of at least ``n`` bytes (sizes are rounded up to whole MiB, so
    few distinct sizes exist); ``give`` hands it back. Given-back buffers are kept (up to
    ``max_bytes`` in all) only while at least one ``session()`` is open, and dropped when the last one
    closes, so a long-lived process (a trainer) holds no transfer memory between publications.
    """

    def __init__(self, max_bytes: int = 160 * MiB):
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._free: dict[int, list[bytearray]] = {}
        self._free_bytes = 0
        self._sessions = 0

    @staticmethod
    def _size(n: int) -> int:
        return max(MiB, -(-n // MiB) * MiB)

    def take(self, n: int) -> bytearray:
        size = self._size(n)
        with self._lock:
            free = self._free.get(size)
            if free:
                self._free_bytes -= size
                return free.pop()
        return bytearray(size)

    def give(self, buf: bytearray) -> None:
        if len(buf) % MiB:
            return  # an odd-sized last part: not worth keeping
        with self._lock:
            if self._sessions and self._free_bytes + len(buf) <= self.max_bytes:
                self._free.setdefault(len(buf), []).append(buf)
                self._free_bytes += len(buf)

    @contextlib.contextmanager
    def session(self):
        """Keep given-back buffers for reuse until the last open session closes."""
        with self._lock:
            self._sessions += 1
        try:
            yield self
        finally:
            with self._lock:
                self._sessions -= 1
                if not self._sessions:
                    self._free.clear()
                    self._free_bytes = 0


BUFFERS = BufferCache()


class _OrderedHasher:
    """Run calls (hash updates, completions) on one background thread, in the order they were submitted.

    At most two calls wait in the queue, so memory stays bounded; ``after`` (if given) runs once its
    call is done, to recycle a buffer. ``drain`` waits for everything submitted. Leaving the context
    with an exception stops the thread without running what is still queued.
    """

    _STOP = object()

    def __init__(self):
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is self._STOP:
                return
            fn, args, after = item
            if self._error is None:
                try:
                    fn(*args)
                except BaseException as exc:  # noqa: BLE001 - re-raised by submit() and drain()
                    self._error = exc
            if after is not None:
                after()

    def submit(self, fn: Callable[..., Any], *args: Any, after: Callable[[], None] | None = None) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put((fn, args, after))

    def drain(self) -> None:
        """Wait until every submitted call has run; raise the first one's failure."""
        self._queue.put(self._STOP)
        self._thread.join()
        if self._error is not None:
            raise self._error

    def __enter__(self) -> _OrderedHasher:
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self._thread.is_alive():
            return
        if exc_type is not None:  # drop what is queued; the digests will not be used
            with contextlib.suppress(queue.Empty):
                while True:
                    self._queue.get_nowait()
        self._queue.put(self._STOP)
        self._thread.join()


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
    each range once it is written; ``source`` names the object in errors.
    """

    dest: Path
    size: int
    open_range: Callable[[int, int], AbstractContextManager[RangeReader]]
    start: int = 0
    hasher: Any = None
    progress: Any = None
    source: str = "object"


class _BatchFile:
    """A file of a batch: opened by the first worker to reach it, closed once its last piece is done."""

    def __init__(self):
        self.fd: int | None = None
        self._lock = threading.Lock()

    def _open_first(self) -> int:
        raise NotImplementedError

    def open(self) -> int:
        with self._lock:
            if self.fd is None:
                self.fd = self._open_first()
            return self.fd

    def close(self) -> None:
        with self._lock:
            if self.fd is not None:
                os.close(self.fd)
                self.fd = None


class _Target(_BatchFile):
    """A ``RangedFile`` being written; truncated to its start when first opened."""

    def __init__(self, spec: RangedFile):
        super().__init__()
        self.spec = spec
        self.hasher = spec.hasher

    def _open_first(self) -> int:
        fd, have = _open_target(self.spec)
        try:
            if self.hasher is None:
                self.hasher = _hash_prefix(fd, self.spec.start, self.spec.dest) if self.spec.start else hashlib.sha256()
            # Only when there is something to cut: on ext4 a truncate to size 0, even of an empty new file,
            # marks the file to be flushed when it is closed (auto_da_alloc), which cost a 1 GiB download
            # 0.3 s of writeback inside the transfer.
            if have != self.spec.start:
                os.ftruncate(fd, self.spec.start)
        except BaseException:
            os.close(fd)
            raise
        return fd


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


def _commit_workers(concurrency: int) -> int:
    """Commit threads: many small files must not wait on one another's fsync or completion request."""
    return max(1, min(8, concurrency))


class _Stream:
    """What both batches share: one in-order hashing thread, commit threads, and the first failure of
    any of them (or of a worker) stopping the stream. Made by ``_stream``."""

    def __init__(self, hashing: _OrderedHasher, commits: ThreadPoolExecutor, finished: list[Future]):
        self.hashing, self._commits, self._finished = hashing, commits, finished

    def commit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on a commit thread (called from the hashing thread, after a file's last bytes)."""
        self._finished.append(self._commits.submit(fn, *args))

    def run(self, items: Sequence[T], work: Callable[[T], R], consume: Callable[[T, R], None], name: str,
            concurrency: int, window: int | None = None) -> None:
        def checked(item: T, result: R) -> None:
            while self._finished and self._finished[0].done():
                self._finished.pop(0).result()  # raises what a commit raised
            consume(item, result)

        ordered_map(items, work, checked, concurrency=concurrency, name=name, window=window)
        self.hashing.drain()
        self._commits.shutdown(wait=True)
        for fut in self._finished:
            fut.result()


@contextlib.contextmanager
def _stream(files: Sequence[_BatchFile], concurrency: int, cleanup: Callable[[], None] | None = None):
    """A ``_Stream`` over ``files``; on the way out (after the commits have returned) ``cleanup`` runs,
    then every file still open is closed and the buffers are released."""
    finished: list[Future] = []
    with ExitStack() as stack:
        stack.enter_context(BUFFERS.session())
        stack.callback(lambda: [f.close() for f in files])
        if cleanup is not None:
            stack.callback(cleanup)
        commits = stack.enter_context(ThreadPoolExecutor(max_workers=_commit_workers(concurrency),
                                                         thread_name_prefix="commit"))
        stack.callback(lambda: [f.cancel() for f in finished])  # on failure: no new commits
        yield _Stream(stack.enter_context(_OrderedHasher()), commits, finished)


def download_batch(files: Sequence[RangedFile], *, concurrency: int = 8, range_size: int = DEFAULT_RANGE_SIZE,
                   finish: Callable[[int, FileDigest], None] | None = None) -> list[FileDigest]:
    """Download ``files`` as one stream of ranges; return each whole file's ``FileDigest``, in order.

    The ranges of all files form one ordered stream, so the next file's first ranges start while the
    previous file's last ones are still in flight and no file boundary leaves the connections idle.
    Each worker streams its range into a reused buffer, writing every piece to the file at once (while
    it is still in the CPU cache); finished ranges reach one hashing thread in stream order, so each
    file is hashed in order and no byte is read back. A range whose reader raises ``TransientRead`` is
    fetched again (four attempts in all); one that ends early fails the download naming its source.

    When a file's last range is hashed, ``finish(index, digest)`` runs on a commit thread (the caller's
    verify / fsync / rename; several files' commits may run at once, in any order) while later files
    keep downloading. The first failure, of a
    range or of ``finish``, stops the stream once the running work has returned and is raised; files
    whose ``finish`` completed stay as it left them. Files are not fsynced here.
    """
    targets = [_Target(f) for f in files]
    items: list[tuple[int, int, int, bool]] = []
    for i, spec in enumerate(files):
        if not 0 <= spec.start <= spec.size:
            raise ValueError(f"resume offset {spec.start} is outside 0..{spec.size} for {spec.dest}")
        spans = split_ranges(spec.start, spec.size, range_size) or [(spec.start, 0)]  # an empty rest still creates it
        items += [(i, off, n, k == len(spans) - 1) for k, (off, n) in enumerate(spans)]
    digests: list[FileDigest | None] = [None] * len(files)

    def fill(target: _Target, fd: int, offset: int, view: memoryview) -> None:
        filled = 0
        with target.spec.open_range(offset, len(view)) as reader:
            while filled < len(view):
                n = reader.readinto(view[filled:filled + IO_PIECE])
                if not n:
                    break
                _pwrite_all(fd, view[filled:filled + n], offset + filled)
                filled += n
        if filled != len(view):
            raise VerificationFailed(
                f"{target.spec.source} returned {filled} bytes for the range at {offset}, expected {len(view)}",
                remedy="the source is shorter than its recorded size; check it")

    def work(item: tuple[int, int, int, bool]) -> bytearray | None:
        i, offset, length, _ = item
        fd = targets[i].open()
        if not length:
            return None
        buf = BUFFERS.take(length)
        try:
            retry_call(lambda: fill(targets[i], fd, offset, memoryview(buf)[:length]), retry_on=(TransientRead,))
        except BaseException:
            BUFFERS.give(buf)
            raise
        return buf

    with _stream(targets, concurrency) as stream:
        def complete(i: int) -> None:  # on the hashing thread, after the file's last bytes
            digests[i] = FileDigest(files[i].size, targets[i].hasher.hexdigest())
            if finish is not None:
                stream.commit(finish, i, digests[i])

        def consume(item: tuple[int, int, int, bool], buf: bytearray | None) -> None:
            i, _, length, last = item
            target = targets[i]
            if buf is not None:
                stream.hashing.submit(target.hasher.update, memoryview(buf)[:length],
                                      after=lambda: BUFFERS.give(buf))
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


@dataclass
class PartedFile:
    """One file of an ``upload_batch``, sent as numbered parts (1..N) of ``part_size`` bytes.

    ``begin()`` runs once before its first part (a multipart upload is created); ``send(number, data)``
    returns what the commit needs (an ETag) and must not keep ``data`` once it returns (the buffer is
    reused); ``abort()`` runs if the batch fails after ``begin`` and before the file's commit returned.
    ``handle`` is the caller's own state (the upload id). ``hash_sent=False`` skips the in-order hash
    of the sent bytes (the commit gets None): only for a ``send`` whose server verifies every part
    against a digest taken when the file was hashed.
    """

    path: Path
    size: int
    part_size: int
    send: Callable[[int, bytearray], Any]
    begin: Callable[[], None] | None = None
    abort: Callable[[], None] | None = None
    progress: Any = None
    handle: Any = None
    hash_sent: bool = True


class _Source(_BatchFile):
    """A ``PartedFile`` being sent; its upload is begun when it is first opened."""

    def __init__(self, spec: PartedFile):
        super().__init__()
        self.spec = spec
        self.began = self.committed = False
        self.hasher = hashlib.sha256()
        self.results: list[Any] = []

    def _open_first(self) -> int:
        fd = os.open(self.spec.path, os.O_RDONLY)
        try:
            if self.spec.begin is not None:
                self.spec.begin()
        except BaseException:
            os.close(fd)
            raise
        self.began = True
        return fd


def upload_batch(files: Sequence[PartedFile], *, concurrency: int = 8,
                 finish: Callable[[int, list[Any], str | None], None] | None = None) -> None:
    """Send ``files`` as one stream of parts; commit each file once its parts are sent and hashed.

    The parts of all files form one ordered stream, so the next file's first parts go out while the
    previous file's last ones are in flight. Each part is read into a reused buffer with
    ``os.preadv`` inside its worker; sent parts reach one hashing thread in stream order, so each
    file's sha256 is that of the bytes actually sent (None for a file with ``hash_sent=False``,
    whose buffers go straight back). When a file's last part is hashed,
    ``finish(index, results, sha256)`` runs on a commit thread (the caller compares the digest and
    completes the upload; several files' commits may run at once, in any order) while later files keep
    sending. A file shorter than its ``size`` fails
    the batch. The first failure stops the stream once the running work has returned and is raised;
    files begun but not committed are aborted.
    """
    sources = [_Source(f) for f in files]
    items: list[tuple[int, int, int, int, bool]] = []
    for i, spec in enumerate(files):
        if spec.size <= 0:
            raise ValueError(f"{spec.path}: an upload in parts needs a non-empty file")
        spans = split_ranges(0, spec.size, spec.part_size)
        items += [(i, k + 1, off, n, k == len(spans) - 1) for k, (off, n) in enumerate(spans)]

    def work(item: tuple[int, int, int, int, bool]) -> tuple[bytearray | None, Any]:
        i, number, offset, length, _ = item
        source = sources[i]
        fd = source.open()
        # A body must be exactly the part (botocore sends a bytearray whole): a short last part gets a
        # buffer of its own size.
        data = BUFFERS.take(length) if length % MiB == 0 else bytearray(length)
        try:
            view = memoryview(data)[:length]
            got = 0
            while got < length:
                n = os.preadv(fd, [view[got:]], offset + got)
                if not n:
                    raise VerificationFailed(
                        f"{source.spec.path} is shorter than the {source.spec.size} bytes that were hashed",
                        remedy="the file changed after it was hashed; hash it again", path=str(source.spec.path))
                got += n
            result = source.spec.send(number, data)
        except BaseException:
            BUFFERS.give(data)
            raise
        if source.spec.hash_sent:
            return data, result  # hashed in order, then given back
        BUFFERS.give(data)  # nothing reads it again: the next part can use it at once
        return None, result

    def commit(i: int, sha256: str | None) -> None:
        if finish is not None:
            finish(i, sources[i].results, sha256)
        sources[i].committed = True

    def abort_uncommitted() -> None:
        for source in sources:
            if source.began and not source.committed and source.spec.abort is not None:
                with contextlib.suppress(Exception):
                    source.spec.abort()

    with _stream(sources, concurrency, cleanup=abort_uncommitted) as stream:
        def complete(i: int) -> None:  # on the hashing thread, after the file's last part
            stream.commit(commit, i, sources[i].hasher.hexdigest() if sources[i].spec.hash_sent else None)

        def consume(item: tuple[int, int, int, int, bool], out: tuple[bytearray | None, Any]) -> None:
            i, _, _, length, last = item
            source, (data, result) = sources[i], out
            if data is not None:
                stream.hashing.submit(source.hasher.update, data, after=lambda: BUFFERS.give(data))
            source.results.append(result)
            if source.spec.progress is not None:
                source.spec.progress.update(length)
            if last:
                source.close()
                stream.hashing.submit(complete, i)

        # Parts whose bytes the server checks are not hashed here: their buffers go back as soon as they
        # are sent and only ETags wait to be consumed, so one slow part need not stall the others.
        hashed_here = any(f.hash_sent for f in files)
        stream.run(items, work, consume, "upload", concurrency, window=None if hashed_here else 16 * concurrency)
