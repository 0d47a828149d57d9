"""Download declared files into a staging directory: through ``.part`` temporaries, hashed while written.

Each file is written by ``store.download_file`` into a process-unique part (``stage.claim_part``),
hashed in order as its ranges arrive (one pass, no re-read), compared with the declared size and
sha256, and only then renamed into place. A part left by a killed fetch is continued from its
re-verified prefix; the whole-file digest decides (see ``reader``'s docstring for why a prefix cannot
be proven on its own): a mismatch after a resume costs one whole download, a mismatch of a whole
download is an error naming the object, and its part is removed.

Concurrency follows the publisher: a file larger than one range is fetched alone, its ranges in
parallel (the store bounds memory to its range window); smaller files go several at a time, since
each is one request. One byte-accurate bar on stderr counts bytes as they are written.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path

from .. import testhooks
from ..digest import FileDigest
from ..errors import VerificationFailed
from ..fsutil import fsync_file, payload_fsync_enabled
from ..progress import ByteProgress
from ..records.inventory import FileEntry
from ..store.base import ObjectStore
from ..store.transfer import DEFAULT_RANGE_SIZE
from . import stage
from .keys import object_key

log = logging.getLogger(__name__)

SMALL_FILE_WORKERS = 8


class _FileProgress:
    """One file's view of the shared bar; announces ``fetch:mid-file:<path>`` once, after its first range."""

    def __init__(self, bar: ByteProgress, path: str, remaining: int):
        self._bar, self._path, self._remaining, self._seen = bar, path, remaining, 0

    def update(self, nbytes: int) -> None:
        self._bar.update(nbytes)
        first = self._seen == 0
        self._seen += nbytes
        if first and self._seen < self._remaining:
            testhooks.reached(f"fetch:mid-file:{self._path}")


def _grow(bar: ByteProgress, nbytes: int) -> None:
    """A resumed prefix failed the final check and is fetched again: keep the bar's total byte-accurate."""
    bar.total += nbytes
    if bar._bar is not None:
        bar._bar.total = bar.total
        bar._bar.refresh()


def _range_size(store: ObjectStore) -> int:
    return getattr(store, "download_range_size", None) or getattr(store, "range_size", None) or DEFAULT_RANGE_SIZE


def download_files(store: ObjectStore, prefix: str, staged: Path, todo: list[FileEntry], *,
                   where: Callable[[str], str], progress: bool | None = None) -> tuple[int, list[dict]]:
    """Download every ``todo`` entry to ``staged/<path>``, verified; return (bytes received, ranged resumes).

    ``where(path)`` names an object in messages. Raises on the first failure after the files already
    running have finished (their verified files stay in place; a rerun keeps them).
    """
    jobs = []
    for entry in sorted(todo, key=lambda e: (-e.size, e.path)):
        final = staged / entry.path
        final.parent.mkdir(parents=True, exist_ok=True)
        part, offset = stage.claim_part(final, entry.size)
        hasher = stage.hash_prefix(part, offset) if offset else None
        jobs.append((entry, final, part, offset if hasher is not None else 0, hasher))
    resumed = [{"path": e.path, "offset": off} for e, _, _, off, _ in jobs if off]

    with ByteProgress(sum(e.size - off for e, _, _, off, _ in jobs), "fetch", progress) as bar:
        def one(job) -> None:
            entry, final, part, offset, hasher = job
            expected = FileDigest(entry.size, entry.sha256)
            key = object_key(prefix, entry.path)
            try:
                got = store.download_file(key, part, size=entry.size, start=offset, hasher=hasher,
                                          progress=_FileProgress(bar, entry.path, entry.size - offset))
                if offset and got != expected:
                    log.warning("resumed download of %s did not verify; downloading it whole", where(entry.path))
                    _grow(bar, offset)
                    got = store.download_file(key, part, size=entry.size, progress=_FileProgress(bar, entry.path, 0))
                if got != expected:
                    raise VerificationFailed(
                        f"{where(entry.path)} downloaded as {got.size} bytes sha256 {got.sha256}, but the archive "
                        f"declares {entry.size} bytes sha256 {entry.sha256}; the partial download was removed",
                        remedy="the archived object is damaged or was replaced; restore it or republish the artifact")
                if payload_fsync_enabled():
                    fsync_file(part)  # durable before the rename commits it (CKPTFLOW_FSYNC=0 skips)
                os.replace(part, final)
            except VerificationFailed:
                part.unlink(missing_ok=True)
                raise
            testhooks.reached("fetch:after-file")
            testhooks.reached(f"fetch:after-file:{entry.path}")

        range_size = _range_size(store)
        try:
            import os as _os
            if _os.environ.get("XP2"):
                store.concurrency = 4
                _run_concurrently(one, [j for j in jobs if j[0].size - j[3] > range_size], workers=2)
                store.concurrency = 8
            else:
              for job in jobs:
                if job[0].size - job[3] > range_size:
                    one(job)
            _run_concurrently(one, [j for j in jobs if j[0].size - j[3] <= range_size])
        finally:
            for _, _, part, _, _ in jobs:
                stage.release(part)
    for _, final, _, _, _ in jobs:
        for leftover in stage.leftover_parts(final):  # older parts of files now in place
            leftover.unlink(missing_ok=True)
    return bar.done, resumed


def _run_concurrently(fn, items: list, workers=SMALL_FILE_WORKERS) -> None:
    """``fn`` over ``items`` on a pool; on the first failure, cancel what has not started and raise it."""
    if not items:
        return
    with ThreadPoolExecutor(max_workers=min(workers, len(items)), thread_name_prefix="fetch") as pool:
        futures = [pool.submit(fn, item) for item in items]
        wait(futures, return_when=FIRST_EXCEPTION)
        for fut in futures:
            fut.cancel()
        wait(futures)
    errors = [f.exception() for f in futures if not f.cancelled() and f.exception() is not None]
    if errors:
        raise errors[0]
