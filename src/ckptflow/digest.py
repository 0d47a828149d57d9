"""Streaming SHA-256: one pass per file, large chunks, files hashed in parallel, progress on stderr.

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
from dataclasses import dataclass
from pathlib import Path

from .progress import ByteProgress

CHUNK_SIZE = 8 * 1024 * 1024
PIPE_PIECE = 2 * 1024 * 1024
PIPE_BUFFERS = 3
SHA256_HEX_LEN = 64


@dataclass(frozen=True, slots=True)
class FileDigest:
    size: int
    sha256: str


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def is_sha256_hex(value: object) -> bool:
    return (
        isinstance(value, str)
        and len(value) == SHA256_HEX_LEN
        and all(c in "0123456789abcdef" for c in value)
    )


def sha256_file(
    path: Path | str, *, chunk_size: int = CHUNK_SIZE, on_bytes: Callable[[int], None] | None = None
) -> FileDigest:
    """Hash one file in a single streaming pass; the size is what was read, not what stat said.

    A file larger than a few pieces is read and hashed at once: this thread reads the next piece
    while a helper thread hashes the last (``PIPE_BUFFERS`` pieces of ``PIPE_PIECE`` bytes), so the
    copy out of the page cache hides behind the hash when a core is free.
    """
    with open(path, "rb", buffering=0) as fh:
        if os.fstat(fh.fileno()).st_size > PIPE_BUFFERS * PIPE_PIECE:
            return _sha256_piped(fh, on_bytes)
        h = hashlib.sha256()
        buf = bytearray(chunk_size)
        view = memoryview(buf)
        size = 0
        while True:
            n = fh.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            size += n
            if on_bytes is not None:
                on_bytes(n)
    return FileDigest(size=size, sha256=h.hexdigest())


def _sha256_piped(fh, on_bytes: Callable[[int], None] | None) -> FileDigest:
    h = hashlib.sha256()
    free: queue.SimpleQueue = queue.SimpleQueue()
    full: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(PIPE_BUFFERS):
        free.put(bytearray(PIPE_PIECE))

    def hash_pieces() -> None:
        while (item := full.get()) is not None:
            buf, n = item
            h.update(memoryview(buf)[:n])
            free.put(buf)

    hasher = threading.Thread(target=hash_pieces, name="sha256", daemon=True)
    hasher.start()
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
        hasher.join()
    return FileDigest(size=size, sha256=h.hexdigest())


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


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def hash_files(
    root: Path | str,
    relpaths: Iterable[str],
    *,
    workers: int | None = None,
    progress: bool | None = None,
    desc: str = "sha256",
) -> dict[str, FileDigest]:
    """Hash ``root/relpath`` for every relpath, in parallel, with one byte-accurate bar for all files.

    Callers validate the relative paths (``fsutil.safe_relpath`` / ``walk_files``) before calling.
    Returns a dict sorted by path.
    """
    root = Path(root)
    rels = sorted(set(relpaths))
    total = sum((root / r).stat().st_size for r in rels)
    with ByteProgress(total, desc, progress) as bar:
        def one(rel: str) -> tuple[str, FileDigest]:
            return rel, sha256_file(root / rel, on_bytes=bar.update)

        n = workers or default_workers()
        if n == 1 or len(rels) <= 1:
            results = [one(r) for r in rels]
        else:
            with ThreadPoolExecutor(max_workers=min(n, len(rels)), thread_name_prefix="sha256") as pool:
                results = list(pool.map(one, rels))
    return dict(sorted(results))


class HashingWriter:
    """Wrap a binary file object: every written byte is also hashed (one pass, no re-read)."""

    def __init__(self, fh):
        self._fh = fh
        self._h = hashlib.sha256()
        self.size = 0

    def write(self, data) -> int:
        n = self._fh.write(data)
        self._h.update(data)
        self.size += len(data)
        return n

    def hexdigest(self) -> str:
        return self._h.hexdigest()
