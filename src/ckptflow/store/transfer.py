"""Backend-neutral transfer machinery: concurrent ranged downloads and part uploads, hashed in order.

Both directions run byte ranges on a thread pool and hand each finished range to the calling thread in
*file order*, where it is hashed. A range that finishes early waits in memory until the ranges before
it are hashed; at most ``concurrency`` ranges are in flight and ``2 × concurrency`` in flight or
waiting, so memory stays below ``2 × concurrency × range size`` while the file is read or written
exactly once:

- ``download_ranges`` writes the ranges sequentially in file order while a second thread hashes them,
  and returns the ``FileDigest`` of the whole file (a verified prefix is accounted for by a pre-fed
  hasher).
- ``upload_parts`` reads each part with ``os.pread`` and returns the parts' results plus the sha256 of
  the bytes actually sent, so a file that changed after it was hashed is caught before the upload is
  committed.

Progress is counted when a range has been written or a part acknowledged, so retries never count twice.
The backends supply only ``fetch_range(offset, length) -> bytes`` and ``upload_part(number, data)``.
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
from pathlib import Path
from typing import Any, TypeVar

from ..digest import CHUNK_SIZE, FileDigest
from ..errors import UnsafePath, VerificationFailed
from ..progress import ByteProgress

DEFAULT_RANGE_SIZE = 8 * 1024 * 1024
MIN_PART_SIZE = 5 * 1024 * 1024  # S3's minimum for every part but the last
MAX_PARTS = 10_000

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
                concurrency: int, name: str = "transfer") -> None:
    """Run ``work`` on a pool and call ``consume`` in the calling thread, strictly in ``items`` order.

    At most ``concurrency`` items run at once and at most ``2 * concurrency`` are running or
    finished-but-unconsumed: the slack keeps every worker busy while one slow item holds up the
    in-order consumer, and bounds memory to ``2 * concurrency`` results. The first failure cancels what
    has not started, waits for what is running, and propagates.
    """
    if not items:
        return
    window = 2 * max(1, concurrency)
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


class _OrderedHasher:
    """Feed ``hasher`` from a background thread, in the order ``update`` was called.

    At most two chunks wait in the queue, so memory stays bounded; an exception in the caller stops
    the thread without waiting for the queue to drain.
    """

    _STOP = object()

    def __init__(self, hasher: Any):
        self._hasher = hasher
        self._queue: queue.Queue = queue.Queue(maxsize=2)
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is self._STOP:
                return
            self._hasher.update(item)

    def update(self, data: bytes) -> None:
        self._queue.put(data)

    def __enter__(self) -> _OrderedHasher:
        self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:  # drop what is queued; the digest will not be used
            with contextlib.suppress(queue.Empty):
                while True:
                    self._queue.get_nowait()
        self._queue.put(self._STOP)
        self._thread.join()


def _hash_prefix(fd: int, length: int, dest: Path) -> Any:
    """Hash the first ``length`` bytes already in ``dest`` (when resuming without a pre-fed hasher)."""
    h = hashlib.sha256()
    offset = 0
    while offset < length:
        data = os.pread(fd, min(CHUNK_SIZE, length - offset), offset)
        if not data:
            raise VerificationFailed(f"{dest} holds {offset} bytes, fewer than the resume offset {length}",
                                     remedy="delete the partial file and download again", path=str(dest))
        h.update(data)
        offset += len(data)
    return h


def download_ranges(dest: Path, *, size: int, fetch_range: Callable[[int, int], bytes], start: int = 0,
                    hasher=None, concurrency: int = 8, range_size: int = DEFAULT_RANGE_SIZE,
                    progress: ByteProgress | None = None, source: str = "object") -> FileDigest:
    """Fill bytes ``[start, size)`` of ``dest`` from ``fetch_range`` and return the whole file's digest.

    ``dest`` is created if absent (a symlink is refused, never followed) and truncated to ``start``
    (bytes past the verified prefix are rewritten). It is not fsynced: callers that commit the file
    (fetch staging) flush it before the rename that makes it count. ``hasher`` must already hold bytes ``[0, start)``; without one they are
    re-read from ``dest``. ``source`` names the object in errors.
    """
    dest = Path(dest)
    if not 0 <= start <= size:
        raise ValueError(f"resume offset {start} is outside 0..{size} for {dest}")
    try:
        fd = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafePath(f"download target {dest} is a symlink", remedy="remove the link; ckptflow writes "
                             "only regular files it created") from None
        raise
    try:
        have = os.fstat(fd).st_size
        if have < start:
            raise VerificationFailed(f"{dest} holds {have} bytes, fewer than the resume offset {start}",
                                     remedy="delete the partial file and download again", path=str(dest))
        if hasher is None:
            hasher = _hash_prefix(fd, start, dest) if start else hashlib.sha256()
        os.ftruncate(fd, start)

        def work(rng: tuple[int, int]) -> bytes:
            offset, length = rng
            data = fetch_range(offset, length)
            if len(data) != length:
                raise VerificationFailed(
                    f"{source} returned {len(data)} bytes for the range at {offset}, expected {length}",
                    remedy="the source is shorter than its recorded size; check it",
                )
            return data

        # Ranges arrive in file order: they are written sequentially here (much faster than workers
        # writing into one file at once) while a second thread hashes them, so hashing and writing
        # overlap and no byte is read twice.
        with _OrderedHasher(hasher) as background:
            def consume(rng: tuple[int, int], data: bytes) -> None:
                background.update(data)
                view = memoryview(data)
                offset, written = rng[0], 0
                while written < len(data):
                    written += os.pwrite(fd, view[written:], offset + written)
                if progress is not None:
                    progress.update(len(data))

            ordered_map(split_ranges(start, size, range_size), work, consume, concurrency=concurrency,
                        name="download")
    finally:
        os.close(fd)
    return FileDigest(size=size, sha256=hasher.hexdigest())


def upload_parts(path: Path, *, size: int, part_size: int, upload_part: Callable[[int, bytes], R],
                 concurrency: int = 8, progress: ByteProgress | None = None) -> tuple[list[R], str]:
    """Send ``path`` as numbered parts (1..N) concurrently; return the results in order and the sha256.

    Each part is read with ``os.pread`` inside its worker; ``upload_part(number, data)`` returns what
    the commit step needs (an ETag). A file shorter than ``size`` fails the upload.
    """
    parts = [(i + 1, off, length) for i, (off, length) in enumerate(split_ranges(0, size, part_size))]
    results: list[R] = []
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        def work(part: tuple[int, int, int]) -> tuple[bytes, R]:
            number, offset, length = part
            data = os.pread(fd, length, offset)
            if len(data) != length:
                raise VerificationFailed(
                    f"{path} is shorter than the {size} bytes that were hashed",
                    remedy="the file changed after it was hashed; hash it again", path=str(path),
                )
            return data, upload_part(number, data)

        def consume(part: tuple[int, int, int], out: tuple[bytes, R]) -> None:
            h.update(out[0])
            results.append(out[1])
            if progress is not None:
                progress.update(len(out[0]))

        ordered_map(parts, work, consume, concurrency=concurrency, name="upload")
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return results, h.hexdigest()
