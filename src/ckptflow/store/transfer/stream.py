"""The streaming machinery shared by downloads and uploads: ordered work on a thread pool, reused
buffers, one in-order hashing thread and the commit threads of a batch (see ``transfer/__init__.py``).

Both directions run byte ranges on a thread pool and hand each finished range to the calling thread in
*file order*, where it is hashed. A range that finishes early waits in memory until the ranges before
it are hashed; at most ``concurrency`` ranges are in flight and ``2 × concurrency`` in flight or
waiting, so memory stays below about ``2 × concurrency × range size`` while the file is read or written
exactly once.

Buffers are reused (``BufferCache``): a fresh multi-MiB allocation per range is an ``mmap`` that is
page-faulted and zeroed on first touch and unmapped (a TLB shoot-down across threads) when freed,
which costs more CPU than hashing the range.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import ExitStack
from typing import Any, TypeVar

from ...digest import PartDigests, grown_part_size
from ...errors import StoreError, VerificationFailed

DEFAULT_RANGE_SIZE = 8 * 1024 * 1024
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
MAX_PARTS = 10_000
# A worker writes what it received in pieces of this size, while they are still in the CPU cache.
IO_PIECE = 256 * 1024
MiB = 1024 * 1024

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


def split_ranges(start: int, end: int, range_size: int) -> list[tuple[int, int]]:
    """``(offset, length)`` pieces covering ``[start, end)``; empty when ``start == end``."""
    if range_size <= 0:
        raise ValueError("range_size must be positive")
    return [(off, min(range_size, end - off)) for off in range(start, end, range_size)]


def ranges_of(start: int, end: int, range_size: int, parts: PartDigests | None) -> list[tuple[int, int]]:
    """``split_ranges``; for a file with part digests, ranges of whole parts (as many as come nearest to
    ``range_size``, at least one) from ``start``, which must be a part boundary (or ``end``), so that
    each range is checked by the worker that received it."""
    if parts is None:
        return split_ranges(start, end, range_size)
    if start % parts.part_size and start != end:
        raise ValueError(f"offset {start} is not a part boundary of {parts.part_size}-byte parts")
    return split_ranges(start, end, max(1, round(range_size / parts.part_size)) * parts.part_size)


class PartMismatch(VerificationFailed):
    """A range's bytes failed their part digest; the range is read once more before the file fails."""


def check_parts(parts: PartDigests, offset: int, view: memoryview, source: str) -> None:
    """Check every part ``view`` holds (from part boundary ``offset``); raise ``PartMismatch`` naming the
    object and the byte range of the first that fails."""
    bad = parts.first_mismatch(offset, view)
    if bad is None:
        return
    index, got = bad
    start, end = parts.span(index)
    raise PartMismatch(
        f"{source}: bytes {start}-{end - 1} (part {index + 1} of {len(parts.digests)}) hash to BLAKE3 {got.hex()}, "
        f"its part digest is {parts.digests[index].hex()}",
        remedy="the archived object is damaged; restore it from another copy or republish the artifact")


def read_range(fill: Callable[[], None], *, checked: bool) -> None:
    """``fill()`` (which reads one range, and checks its parts when ``checked``), fetched again after a
    ``TransientRead`` (``retry_call``). A checked range is read once more after a ``PartMismatch``; a
    second mismatch is raised, saying the range was read twice."""
    def attempt() -> None:
        retry_call(fill, retry_on=(TransientRead,))

    if not checked:
        attempt()
        return
    try:
        attempt()
        return
    except PartMismatch as first:
        log.info("%s; reading the range again", first.message)
    try:
        attempt()
    except PartMismatch as second:
        raise PartMismatch(f"{second.message} (read twice)", remedy=second.remedy) from None


def part_size_for(size: int, part_size: int) -> int:
    """``part_size`` grown (to a whole MiB) just enough that ``size`` fits in ``MAX_PARTS`` parts."""
    return grown_part_size(size, part_size, MAX_PARTS)


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


class BufferCache:
    """Reusable byte buffers for ranges and parts, kept while a transfer session is open.

    ``take(n)`` returns a ``bytearray`` (or, ``aligned``, a page-aligned ``mmap``) of at least ``n`` bytes (sizes are rounded up to whole MiB, so
    few distinct sizes exist); ``give`` hands it back. Given-back buffers are kept (up to
    ``max_bytes`` in all) only while at least one ``session()`` is open, and dropped when the last one
    closes, so a long-lived process (a trainer) holds no transfer memory between publications.
    """

    def __init__(self, max_bytes: int = 160 * MiB):
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._free: dict[tuple[int, bool], list] = {}
        self._free_bytes = 0
        self._sessions = 0

    @staticmethod
    def _size(n: int) -> int:
        return max(MiB, -(-n // MiB) * MiB)

    def take(self, n: int, *, aligned: bool = False) -> bytearray | mmap.mmap:
        """A buffer of at least ``n`` bytes; ``aligned``: page-aligned (an anonymous ``mmap``), as
        ``O_DIRECT`` writes need."""
        size = self._size(n)
        with self._lock:
            free = self._free.get((size, aligned))
            if free:
                self._free_bytes -= size
                return free.pop()
        return mmap.mmap(-1, size) if aligned else bytearray(size)

    def give(self, buf: bytearray | mmap.mmap) -> None:
        if len(buf) % MiB:
            return  # an odd-sized last part: not worth keeping
        key = (len(buf), isinstance(buf, mmap.mmap))
        with self._lock:
            if self._sessions and self._free_bytes + len(buf) <= self.max_bytes:
                self._free.setdefault(key, []).append(buf)
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


class BatchFile:
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


def _commit_workers(concurrency: int) -> int:
    """Commit threads: many small files must not wait on one another's fsync or completion request."""
    return max(1, min(8, concurrency))


class Stream:
    """What both batches share: one in-order hashing thread, commit threads, and the first failure of
    any of them (or of a worker) stopping the stream. Made by ``open_stream``."""

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
def open_stream(files: Sequence[BatchFile], concurrency: int, cleanup: Callable[[], None] | None = None):
    """A ``Stream`` over ``files``; on the way out (after the commits have returned) ``cleanup`` runs,
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
        yield Stream(stack.enter_context(_OrderedHasher()), commits, finished)
