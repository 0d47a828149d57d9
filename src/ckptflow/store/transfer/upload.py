"""Concurrent part uploads, the sent bytes hashed in order.

``upload_batch`` reads each part into a buffer with ``os.preadv`` and gives each file's commit the
parts' results plus the sha256 of the bytes actually sent, so a file that changed after it was hashed
is caught before its upload is committed. Several files form one stream of parts, so no file boundary
leaves the connections idle; each file is committed on a thread of its own. Progress is counted when a
part is acknowledged, so retries never count twice. Backends supply ``send(number, data)``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import testhooks
from ...errors import VerificationFailed
from .stream import BUFFERS, BatchFile, MiB, open_stream, split_ranges


@dataclass
class PartedFile:
    """One file of an ``upload_batch``, sent as numbered parts (1..N) of ``part_size`` bytes.

    ``begin()`` runs once before its first part (a multipart upload is created); ``send(number, data)``
    returns what the commit needs (an ETag) and must not keep ``data`` once it returns (the buffer is
    reused); ``abort()`` runs if the batch fails after ``begin`` and before the file's commit returned.
    ``handle`` is the caller's own state (the upload id). ``hash_sent=False`` skips the in-order hash
    of the sent bytes (the commit gets None): only for a ``send`` whose server verifies every part
    against a digest taken when the file was hashed. ``reused`` maps the numbers of parts an earlier
    upload already holds (proven by the caller) to their results: they are not sent, but with
    ``hash_sent`` their local bytes are still read and hashed in order, so the commit's digest covers
    the whole file.
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
    reused: dict[int, Any] | None = None


class _Source(BatchFile):
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


def _read_part(spec: PartedFile, fd: int, view: memoryview, offset: int) -> None:
    """Fill ``view`` from ``spec``'s file at ``offset``; a file shorter than was hashed is refused."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            raise VerificationFailed(f"{spec.path} is shorter than the {spec.size} bytes that were hashed",
                                     remedy="the file changed after it was hashed; hash it again", path=str(spec.path))
        got += n


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
        reused = source.spec.reused or {}
        if number in reused and not source.spec.hash_sent:
            return None, reused[number]
        # A body must be exactly the part (botocore sends a bytearray whole): a short last part gets a
        # buffer of its own size.
        data = BUFFERS.take(length) if length % MiB == 0 else bytearray(length)
        try:
            _read_part(source.spec, fd, memoryview(data)[:length], offset)
            result = reused[number] if number in reused else source.spec.send(number, data)
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

    with open_stream(sources, concurrency, cleanup=abort_uncommitted) as stream:
        def complete(i: int) -> None:  # on the hashing thread, after the file's last part
            stream.commit(commit, i, sources[i].hasher.hexdigest() if sources[i].spec.hash_sent else None)

        def consume(item: tuple[int, int, int, int, bool], out: tuple[bytearray | None, Any]) -> None:
            i, number, _, length, last = item
            source, (data, result) = sources[i], out
            if data is not None:
                stream.hashing.submit(source.hasher.update, data, after=lambda: BUFFERS.give(data))
            source.results.append(result)
            if source.spec.progress is not None:
                source.spec.progress.update(length)
            testhooks.reached(f"upload:part-{number}-stored")  # parts 1..number of this file are stored
            if last:
                source.close()
                stream.hashing.submit(complete, i)

        # Parts whose bytes the server checks are not hashed here: their buffers go back as soon as they
        # are sent and only ETags wait to be consumed, so one slow part need not stall the others.
        hashed_here = any(f.hash_sent for f in files)
        stream.run(items, work, consume, "upload", concurrency, window=None if hashed_here else 16 * concurrency)
