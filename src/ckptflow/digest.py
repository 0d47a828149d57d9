"""Streaming SHA-256: one pass per file, large chunks, files hashed in parallel, progress on stderr.

One file because it is the one hashing pass of the package: the whole-file digest, the store's part
checksums and the BLAKE3 part digests are taken from the same buffers on the same threads, and the
checks of part digests (``PartDigests``, ``verified_part_prefix``) run that same pass over what is read.

The same pass can also take per-part digests: SHA-256 and MD5 of the store's upload parts (for the
server's per-part checksums) and BLAKE3 of fixed ``part_digest_size`` parts (``PartDigests``: what every
verified read checks, part by part, on as many cores as the machine has; see
``records/part_digests.py``).

hashlib releases the GIL while it digests buffers larger than 2 KiB, so a thread pool scales with cores
without copying data between processes. Chunks are read with ``readinto`` into a few reused buffers per
file (read and hashed on two threads for large files) so hashing a 100 GB file allocates a few MiB.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from .progress import ByteProgress

CHUNK_SIZE = 8 * 1024 * 1024
PIPE_PIECE = 2 * 1024 * 1024
PIPE_BUFFERS = 3
SHA256_HEX_LEN = 64
# BLAKE3 part digests: parts of this size (one download range), grown to a whole MiB just enough that a
# file has at most MAX_PART_DIGESTS of them.
PART_DIGEST_SIZE = 8 * 1024 * 1024
MAX_PART_DIGESTS = 10_000


@dataclass(frozen=True, slots=True)
class FileDigest:
    """A file's size and sha256. ``parts`` optionally holds the raw sha256 of each ``part_size`` slice
    (the last one shorter), taken in the same pass: an object store that verifies per-part checksums
    then refuses any part whose bytes differ from the ones hashed. ``part_md5`` holds the raw MD5 of the
    same slices where asked (``md5_parts``), to prove parts an earlier run stored whose only server
    checksum is an MD5 ETag. Equality ignores the parts."""

    size: int
    sha256: str
    part_size: int = field(default=0, compare=False, repr=False)
    parts: tuple[bytes, ...] | None = field(default=None, compare=False, repr=False)
    part_md5: tuple[bytes, ...] | None = field(default=None, compare=False, repr=False)
    # BLAKE3 of each ``blake3_part_size`` slice (``part_digest_size``), where asked (``blake3_parts``).
    blake3_part_size: int = field(default=0, compare=False, repr=False)
    blake3_parts: tuple[bytes, ...] | None = field(default=None, compare=False, repr=False)


def grown_part_size(size: int, part_size: int, max_parts: int) -> int:
    """``part_size`` grown (to a whole MiB) just enough that ``size`` bytes fit in ``max_parts`` parts."""
    needed = -(-size // max_parts)
    if needed <= part_size:
        return part_size
    mib = 1024 * 1024
    return -(-needed // mib) * mib


def part_digest_size(size: int) -> int:
    """The BLAKE3 part size of a file of ``size`` bytes: ``PART_DIGEST_SIZE``, grown to a whole MiB just
    enough that the file has at most ``MAX_PART_DIGESTS`` parts. It depends on the size alone (never on
    the destination), so every copy of an artifact has the same part digests."""
    return grown_part_size(size, PART_DIGEST_SIZE, MAX_PART_DIGESTS)


def blake3_digest(view) -> bytes:
    """BLAKE3 of ``view`` (32 bytes), computed without the GIL."""
    return blake3.blake3(view).digest()


class _PartHasher:
    """The digest (sha256, md5 or blake3) of each consecutive ``part_size`` slice of a stream fed in
    pieces of any size."""

    def __init__(self, part_size: int, algorithm: str = "sha256"):
        if part_size < 1:
            raise ValueError(f"part_size must be >= 1, not {part_size}")
        self.part_size = part_size
        self._new = blake3.blake3 if algorithm == "blake3" else getattr(hashlib, algorithm)
        self._h = self._new()
        self._filled = 0
        self.digests: list[bytes] = []

    def update(self, view: memoryview) -> None:
        pos = 0
        while pos < len(view):
            take = min(len(view) - pos, self.part_size - self._filled)
            self._h.update(view[pos:pos + take])
            self._filled += take
            pos += take
            if self._filled == self.part_size:
                self.digests.append(self._h.digest())
                self._h, self._filled = self._new(), 0

    def finish(self) -> tuple[bytes, ...]:
        if self._filled:
            self.digests.append(self._h.digest())
            self._h, self._filled = self._new(), 0
        return tuple(self.digests)


class _Parts:
    """The per-part hashers one pass feeds: sha256 and/or md5 of the same ``part_size`` slices, and
    blake3 of ``blake3_part_size`` slices."""

    def __init__(self, part_size: int, sha256: bool, md5: bool, blake3_part_size: int | None = None):
        self.part_size = part_size
        self.sha = _PartHasher(part_size) if sha256 else None
        self.md5 = _PartHasher(part_size, "md5") if md5 else None
        self.blake3 = _PartHasher(blake3_part_size, "blake3") if blake3_part_size else None

    def update(self, view: memoryview) -> None:
        for hasher in (self.sha, self.md5, self.blake3):
            if hasher is not None:
                hasher.update(view)


def _parts_for(part_size: int | None, md5_part_size: int | None,
               blake3_part_size: int | None = None) -> _Parts | None:
    """Per-part sha256 with ``part_size``; per-part md5 with ``md5_part_size`` when it is the same size
    or no sha256 parts are asked for (both are taken from one slicing of the stream); per-part blake3
    with ``blake3_part_size``."""
    if not part_size and not md5_part_size and not blake3_part_size:
        return None
    if part_size and md5_part_size and md5_part_size != part_size:
        md5_part_size = None
    return _Parts(part_size or md5_part_size or 0, bool(part_size), bool(md5_part_size), blake3_part_size)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_sha256_hex(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) == SHA256_HEX_LEN
        and all(c in "0123456789abcdef" for c in value)
    )


def sha256_file(
    path: Path | str | int, *, chunk_size: int = CHUNK_SIZE, on_bytes: Callable[[int], None] | None = None,
    part_size: int | None = None, md5_part_size: int | None = None, blake3_part_size: int | None = None,
) -> FileDigest:
    """Hash one file in a single streaming pass; the size is what was read, not what stat said.

    A file larger than a few pieces is read and hashed at once: this thread reads the next piece
    while a helper thread hashes the last (``PIPE_BUFFERS`` pieces of ``PIPE_PIECE`` bytes), so the
    copy out of the page cache hides behind the hash when a core is free. With ``part_size`` the
    per-part digests (``FileDigest.parts``) are taken from the same pieces on a second helper thread;
    with ``md5_part_size`` (the same part size) also their MD5s (``FileDigest.part_md5``, about
    0.7 GB/s on that thread, so it is asked for only where an earlier upload may be resumed); with
    ``blake3_part_size`` the BLAKE3 part digests (``FileDigest.blake3_parts``) on that thread too.
    ``path`` may be an open descriptor (read from its current offset, left open).
    """
    with open(path, "rb", buffering=0, closefd=not isinstance(path, int)) as fh:
        if os.fstat(fh.fileno()).st_size > PIPE_BUFFERS * PIPE_PIECE:
            return _sha256_piped(fh, on_bytes, _parts_for(part_size, md5_part_size, blake3_part_size))
        h = hashlib.sha256()
        parts = _parts_for(part_size, md5_part_size, blake3_part_size)
        buf = bytearray(chunk_size)
        view = memoryview(buf)
        size = 0
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            if parts is not None:
                parts.update(view[:n])
            size += n
            if on_bytes is not None:
                on_bytes(n)
    return _digest(size, h, parts)


def _digest(size: int, h, parts: _Parts | None) -> FileDigest:
    if parts is None:
        return FileDigest(size=size, sha256=h.hexdigest())
    return FileDigest(size=size, sha256=h.hexdigest(), part_size=parts.part_size,
                      parts=parts.sha.finish() if parts.sha is not None else None,
                      part_md5=parts.md5.finish() if parts.md5 is not None else None,
                      blake3_part_size=parts.blake3.part_size if parts.blake3 is not None else 0,
                      blake3_parts=parts.blake3.finish() if parts.blake3 is not None else None)


def _sha256_piped(fh, on_bytes: Callable[[int], None] | None, parts: _Parts | None = None) -> FileDigest:
    """Reader (this thread) -> whole-file hasher -> part hasher (when asked) -> back to the reader:
    each piece moves down the chain, so the stages work on different pieces at once."""
    h = hashlib.sha256()
    free: queue.SimpleQueue = queue.SimpleQueue()
    full: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(PIPE_BUFFERS + (parts is not None)):
        free.put(bytearray(PIPE_PIECE))

    def stage(inbox: queue.SimpleQueue, update, outbox: queue.SimpleQueue) -> None:
        while (item := inbox.get()) is not None:
            buf, n = item
            update(memoryview(buf)[:n])
            outbox.put(item if outbox is not free else buf)
        if outbox is not free:
            outbox.put(None)

    threads = []
    if parts is None:
        threads.append(threading.Thread(target=stage, args=(full, h.update, free), name="sha256", daemon=True))
    else:
        middle: queue.SimpleQueue = queue.SimpleQueue()
        threads.append(threading.Thread(target=stage, args=(full, h.update, middle), name="sha256", daemon=True))
        threads.append(threading.Thread(target=stage, args=(middle, parts.update, free), name="sha256-parts",
                                        daemon=True))
    for t in threads:
        t.start()
    size = 0
    try:
        while True:
            buf = free.get()
            n = fh.readinto(buf)
            if not n:
                break
            full.put((buf, n))
            size += n
            if on_bytes is not None:
                on_bytes(n)
    finally:
        full.put(None)
        for t in threads:
            t.join()
    return _digest(size, h, parts)


def sha256_prefix(fd: int, length: int):
    """A sha256 fed with the first ``length`` bytes of the open file ``fd`` (read with ``preadv`` into
    one reused buffer); None when the file holds fewer bytes."""
    h = hashlib.sha256()
    view = memoryview(bytearray(min(CHUNK_SIZE, max(length, 1))))
    done = 0
    while done < length:
        n = os.preadv(fd, [view[: min(len(view), length - done)]], done)
        if not n:
            return None
        h.update(view[:n])
        done += n
    return h


def hash_threads() -> int:
    """How many threads may hash at once: the cores this process may run on, or ``CKPTFLOW_HASH_THREADS``
    (never more than those cores)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    raw = os.environ.get("CKPTFLOW_HASH_THREADS", "").strip()
    if raw:
        try:
            return max(1, min(cores, int(raw)))
        except ValueError:
            pass
    return max(1, cores)


_SLOTS_LOCK = threading.Lock()
_SLOTS: tuple[int, threading.BoundedSemaphore] | None = None


def hash_slots() -> threading.BoundedSemaphore:
    """The semaphore every part check holds while it hashes: at most ``hash_threads()`` at once, however
    many transfer threads received bytes (a fresh one when the setting changed)."""
    global _SLOTS
    n = hash_threads()
    with _SLOTS_LOCK:
        if _SLOTS is None or _SLOTS[0] != n:
            _SLOTS = (n, threading.BoundedSemaphore(n))
        return _SLOTS[1]


@dataclass(frozen=True, slots=True)
class PartDigests:
    """A file's declared BLAKE3 part digests: ``digests[k]`` is the BLAKE3 of bytes
    ``[k * part_size, min((k + 1) * part_size, size))``. ``sha256`` is the whole file's declared digest,
    which the record binding these parts vouches for: bytes whose every part checks are that file."""

    size: int
    sha256: str
    part_size: int
    digests: tuple[bytes, ...]

    def __post_init__(self) -> None:
        if self.part_size < 1 or len(self.digests) != -(-self.size // self.part_size):
            raise ValueError(f"{len(self.digests)} part digests of {self.part_size} bytes cannot cover {self.size} bytes")

    def span(self, index: int) -> tuple[int, int]:
        """The byte range ``[start, end)`` of part ``index``."""
        start = index * self.part_size
        return start, min(start + self.part_size, self.size)

    def first_mismatch(self, offset: int, view) -> tuple[int, bytes] | None:
        """Check the whole parts ``view`` holds (it starts at part boundary ``offset``): the first part
        whose BLAKE3 differs and that BLAKE3, or None when all check. Hashes under ``hash_slots()``."""
        if offset % self.part_size:
            raise ValueError(f"offset {offset} is not a part boundary of {self.part_size}-byte parts")
        first = offset // self.part_size
        slots = hash_slots()
        pos = 0
        while pos < len(view):
            index = first + pos // self.part_size
            start, end = self.span(index)
            with slots:
                got = blake3_digest(view[pos:pos + end - start])
            if got != self.digests[index]:
                return index, got
            pos += end - start
        return None


def verified_part_prefix(fd: int, parts: PartDigests, length: int) -> int:
    """The longest run of whole parts (the last, short one included) at the start of the open file ``fd``,
    within its first ``length`` bytes, whose BLAKE3 matches ``parts`` (read with ``preadv``, parts hashed on ``hash_threads()``
    threads): where a resumed download can continue without re-reading anything before it."""
    length = min(length, parts.size)
    whole = length // parts.part_size + (length == parts.size and bool(parts.size % parts.part_size))
    if not whole:
        return 0

    def check(index: int) -> bool:
        start, end = parts.span(index)
        buf = bytearray(end - start)
        view = memoryview(buf)
        done = 0
        while done < len(view):
            n = os.preadv(fd, [view[done:]], start + done)
            if not n:
                return False
            done += n
        return parts.first_mismatch(start, view) is None

    workers = min(hash_threads(), whole)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="blake3") as pool:
        for index, ok in enumerate(pool.map(check, range(whole))):
            if not ok:
                return parts.span(index)[0]
    return parts.span(whole - 1)[1]


def default_workers() -> int:
    """Files hashed at once: the CPUs this process may use (``hash_threads``), at most 8."""
    return max(1, min(8, hash_threads()))


def hash_files(
    root: Path | str,
    relpaths: Iterable[str],
    *,
    workers: int | None = None,
    progress: bool | None = None,
    desc: str = "sha256",
    part_size_for: Callable[[int], int | None] | None = None,
    md5_parts_for: Callable[[str, int], int | None] | None = None,
    blake3_parts_for: Callable[[int], int | None] | None = None,
) -> dict[str, FileDigest]:
    """Hash ``root/relpath`` for every relpath, in parallel, with one byte-accurate bar for all files.

    ``part_size_for(size)``, when given, names the part size whose per-part digests a file of that size
    also gets (None: none), e.g. ``ObjectStore.part_digest_size`` before an upload; ``md5_parts_for(relpath,
    size)`` likewise names the part size of per-part MD5s (files whose earlier upload may be resumed), and
    ``blake3_parts_for(size)`` that of the BLAKE3 part digests (``part_digest_size``).
    Callers validate the relative paths (``fsutil.safe_relpath`` / ``walk_files``) before calling.
    Returns a dict sorted by path.
    """
    root = Path(root)
    rels = sorted(set(relpaths))
    sizes = {r: (root / r).stat().st_size for r in rels}
    total = sum(sizes.values())
    with ByteProgress(total, desc, progress) as bar:
        def one(rel: str) -> tuple[str, FileDigest]:
            part_size = part_size_for(sizes[rel]) if part_size_for is not None else None
            md5_size = md5_parts_for(rel, sizes[rel]) if md5_parts_for is not None else None
            b3_size = blake3_parts_for(sizes[rel]) if blake3_parts_for is not None else None
            return rel, sha256_file(root / rel, on_bytes=bar.update, part_size=part_size, md5_part_size=md5_size,
                                    blake3_part_size=b3_size)

        n = workers or default_workers()
        if n == 1 or len(rels) <= 1:
            results = [one(r) for r in rels]
        else:
            with ThreadPoolExecutor(max_workers=min(n, len(rels)), thread_name_prefix="sha256") as pool:
                results = list(pool.map(one, rels))
    return dict(sorted(results))


# A write at least this large is hashed on a helper thread while this thread writes it.
OVERLAP_MIN = 1024 * 1024
# Pipelined (``HashingWriter(stable=...)``): at most this many bytes of copied writes wait for the hash.
COPY_BACKLOG = 64 * 1024 * 1024


class HashingWriter:
    """Wrap a binary file object: every written byte is also hashed (one pass, no re-read).

    A large write (``OVERLAP_MIN`` bytes or more: a tensor's storage) is hashed on a helper thread while
    this thread writes the same buffer; both release the GIL, so the digest costs what the slower of the
    two costs instead of their sum. ``write`` returns only once both are done: the caller may reuse its
    buffer at once (``torch.save`` hands memory it owns), and the digest sees the bytes in write order.
    ``hexdigest`` (or ``close``) stops the helper thread.

    Pipelined, with ``stable``: ``stable(view)`` says that the written memory stays alive and unchanged
    until ``hexdigest`` returns (a caller that holds the tensors being saved and lets nothing change them).
    Every write is then queued, in order, to one helper thread that hashes while this thread goes on: a
    stable buffer as it is, without waiting; any other small buffer as a copy (``COPY_BACKLOG`` bytes of
    copies at most wait at once); any other large buffer is hashed while it is written and ``write`` waits
    for it, as above. So the digest runs beside everything the writer does between its writes (``torch.save``'s
    CRC-32 of each record, the next tensor) and costs the writer nothing while one core is free.
    ``hexdigest`` waits for the queue."""

    def __init__(self, fh, *, stable: Callable[[memoryview], bool] | None = None):
        self._fh = fh
        self._h = hashlib.sha256()
        self.size = 0
        self._pool: ThreadPoolExecutor | None = None
        self._stable = stable
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self._copied = 0  # bytes of copies queued and not yet hashed
        self._hashed = threading.Condition()
        self._error: BaseException | None = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        if self._stable is not None:
            return self._write_pipelined(data, view)
        if view.nbytes < OVERLAP_MIN:
            n = self._fh.write(data)
            self._h.update(view)
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256-write")
            hashed = self._pool.submit(self._h.update, view)
            try:
                n = self._fh.write(data)
            finally:
                hashed.result()  # the buffer stays the caller's until it is hashed
        self.size += view.nbytes
        return n

    def _write_pipelined(self, data, view: memoryview) -> int:
        if self._queue is None:
            self._queue = queue.SimpleQueue()
            self._thread = threading.Thread(target=self._hash_queued, name="sha256-write", daemon=True)
            self._thread.start()
        assert self._stable is not None
        if self._stable(view):
            self._queue.put((view, None, 0))
            n = self._fh.write(data)
        elif view.nbytes < OVERLAP_MIN:
            with self._hashed:
                while self._copied and self._copied + view.nbytes > COPY_BACKLOG and self._error is None:
                    self._hashed.wait()
                self._copied += view.nbytes
            self._queue.put((bytes(view), None, view.nbytes))
            n = self._fh.write(data)
        else:
            hashed = threading.Event()
            self._queue.put((view, hashed, 0))
            try:
                n = self._fh.write(data)
            finally:
                hashed.wait()  # the buffer stays the caller's until it is hashed
        self.size += view.nbytes
        return n

    def _hash_queued(self) -> None:
        assert self._queue is not None
        while (item := self._queue.get()) is not None:
            buf, hashed, copied = item
            try:
                if self._error is None:
                    self._h.update(buf)
            except BaseException as exc:  # noqa: BLE001 - raised by hexdigest
                self._error = exc
            finally:
                del buf
                if hashed is not None:
                    hashed.set()
                if copied:
                    with self._hashed:
                        self._copied -= copied
                        self._hashed.notify_all()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self._thread is not None:
            assert self._queue is not None
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def hexdigest(self) -> str:
        self.close()
        if self._error is not None:
            raise self._error
        return self._h.hexdigest()
