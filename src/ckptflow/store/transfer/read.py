"""Concurrent ranged reads hashed in order, with nothing written: a download's stream without the disk.

``hash_batch`` is what reading an archive back (``verify --read-data``, a scrub) runs: the ranges of
all objects form one ordered stream on ``stream.ordered_map``, exactly as ``download_batch`` runs them
(same connections, same range size, same reused buffers and in-order hashing thread), but a finished
range is only hashed and its buffer handed back. No temporary file, no page cache to fill or flush:
memory stays within the range window (``2 × concurrency × range size``) and the time is the
download's without its writes.

An object with part digests (``HashedObject.parts``) is read in ranges of whole parts, each checked by
the worker that received it (BLAKE3, at most ``digest.hash_threads()`` at once), so no single hashing
thread bounds the read; a range that fails is read once more, and a second failure ends that object as
a ``VerificationFailed`` naming the byte range.

One object that cannot be read whole (gone since its HEAD, shorter than its recorded size) ends as
that error in its slot and the others go on; any other failure (the endpoint unreachable, a refused
request) stops the stream and is raised.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ...digest import FileDigest, PartDigests
from ...errors import NotFound, VerificationFailed
from ..base import RangeReader
from .stream import (
    BUFFERS,
    DEFAULT_RANGE_SIZE,
    check_parts,
    open_stream,
    ranges_of,
    read_range,
)

READ_PIECE = 1024 * 1024


@dataclass
class HashedObject:
    """One object of a ``hash_batch``: ``size`` bytes read through ``open_range(offset, length)``;
    ``progress.update(n)`` is told each range once it is read; ``source`` names it in errors; ``parts``:
    its declared part digests (then they are checked instead of hashing it whole)."""

    size: int
    open_range: Callable[[int, int], AbstractContextManager[RangeReader]]
    source: str = "object"
    progress: Any = None
    parts: PartDigests | None = None


def _read_range(obj: HashedObject, offset: int, view: memoryview) -> None:
    filled = 0
    with obj.open_range(offset, len(view)) as reader:
        while filled < len(view):
            n = reader.readinto(view[filled:filled + READ_PIECE])
            if not n:
                break
            filled += n
    if filled != len(view):
        raise VerificationFailed(
            f"{obj.source} returned {filled} bytes for the range at {offset}, expected {len(view)}",
            remedy="the object is shorter than its recorded size; restore it from another copy or republish")
    if obj.parts is not None:
        check_parts(obj.parts, offset, view, obj.source)


def hash_batch(objects: Sequence[HashedObject], *, concurrency: int = 8,
               range_size: int = DEFAULT_RANGE_SIZE) -> list[FileDigest | NotFound | VerificationFailed]:
    """Read ``objects`` as one stream of ranges and return, in order, each one's ``FileDigest`` or the
    ``NotFound`` / ``VerificationFailed`` that stopped reading it (the others are read regardless)."""
    items: list[tuple[int, int, int, bool]] = []
    for i, obj in enumerate(objects):
        spans = ranges_of(0, obj.size, range_size, obj.parts) or [(0, 0)]
        items += [(i, off, n, k == len(spans) - 1) for k, (off, n) in enumerate(spans)]
    hashers = [hashlib.sha256() for _ in objects]
    failed: list[NotFound | VerificationFailed | None] = [None] * len(objects)
    results: list[FileDigest | NotFound | VerificationFailed | None] = [None] * len(objects)

    def work(item: tuple[int, int, int, bool]) -> tuple[bytearray, memoryview] | None:
        i, offset, length, _ = item
        if not length or failed[i] is not None:
            return None
        buf = BUFFERS.take(length)
        view = memoryview(buf)[:length]
        try:
            read_range(lambda: _read_range(objects[i], offset, view), checked=objects[i].parts is not None)
        except (NotFound, VerificationFailed) as exc:  # this object only: the scrub reports it and goes on
            failed[i] = exc
            view.release()
            BUFFERS.give(buf)
            return None
        except BaseException:
            view.release()
            BUFFERS.give(buf)
            raise
        return buf, view

    with open_stream([], concurrency) as stream:
        def complete(i: int) -> None:  # on the hashing thread, after the object's last range
            parts = objects[i].parts  # every range checked: the declared bytes
            results[i] = failed[i] or FileDigest(objects[i].size, parts.sha256 if parts is not None
                                                 else hashers[i].hexdigest())

        def consume(item: tuple[int, int, int, bool], got: tuple[bytearray, memoryview] | None) -> None:
            i, _, length, last = item
            if got is not None:
                buf, view = got
                if objects[i].parts is not None:  # checked by its worker already
                    view.release()
                    BUFFERS.give(buf)
                else:
                    stream.hashing.submit(hashers[i].update, view, after=lambda: BUFFERS.give(buf))
                if objects[i].progress is not None:
                    objects[i].progress.update(length)
            if last:
                stream.hashing.submit(complete, i)

        stream.run(items, work, consume, "read", concurrency)
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]
