"""Download declared files into a staging directory: through ``.part`` temporaries, hashed while written.

Each file is written into a process-unique part (``stage.claim_part``), hashed in order as its
ranges arrive (one pass, no re-read), compared with the declared size and sha256, flushed, and only
then renamed into place. A file with declared part digests (``parts``) is instead checked range by range
as it arrives (``transfer.download_batch``), and its resumed prefix is checked part by part
(``stage.verified_prefix``): no whole-file SHA-256 is computed. A part left by a killed fetch is
continued from its re-verified prefix; otherwise the whole-file digest decides (see ``reader``'s docstring for why a prefix cannot
be proven on its own): a mismatch after a resume costs one whole download, a mismatch of a whole
download is an error naming the object, and its part is removed.

All files form one stream of ranges (``transfer.download_batch``), largest file first: the store's
concurrency is kept busy across file boundaries, memory stays bounded by one range window, and a
file is checked, flushed and renamed on a commit thread while later files download. One
byte-accurate bar on stderr counts bytes as they are written.

A disk that fills during the download (ENOSPC, EDQUOT) fails as ``OutOfSpace`` naming the file that
was being written (``space.out_of_space``); files verified before it stay in place, the parts stay for
the rerun to resume.

``no_clobber`` (restore, which writes into an artifact directory it does not own): a verified part is put
in place with ``link`` (which never replaces) instead of ``rename``; a file that appeared at its path
meanwhile is kept, and is accepted only when it hashes to the declared digest (another restore put the
same bytes there), else the download fails naming it. A restore also passes ``mtime_ns``, the manifest's own
modification time: each file it puts back looks, to ``artifact.changed_payloads``, like the one the manifest
committed (written no later than it), and a later rewrite in place still shows.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path

from .. import testhooks
from ..digest import FileDigest, PartDigests, sha256_file
from ..errors import ConflictError, OutOfSpace, VerificationFailed
from ..fsutil import fsync_file, payload_fsync_enabled
from ..progress import ByteProgress
from ..records.inventory import FileEntry
from ..store.base import ObjectStore
from ..store.transfer import RangedFile, download_batch
from . import space, stage
from .keys import object_key

log = logging.getLogger(__name__)


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


def download_range_size(store: ObjectStore) -> int:
    """The range size a download (fetch, or a read back by verify) uses with ``store``."""
    return store.download_shape.range_size


def download_connections(store: ObjectStore) -> int:
    """The connections a download (fetch, or a read back by verify) keeps busy with ``store``."""
    return store.download_shape.connections


def put_in_place(part: Path, final: Path, expected: FileDigest, *, no_clobber: bool,
                 mtime_ns: int | None = None) -> None:
    """Commit a verified ``part`` as ``final``: a rename, or with ``no_clobber`` a link that never replaces
    a file standing there (kept; accepted only when it holds the expected bytes, else ``ConflictError``).
    ``mtime_ns``: the part's times are set to it first (a restore: the manifest's own, see the module doc)."""
    if mtime_ns is not None:
        os.utime(part, ns=(mtime_ns, mtime_ns))  # our own verified part, not yet in place: a metadata change
    if not no_clobber:
        os.replace(part, final)
        return
    try:
        os.link(part, final)
        same = True
        testhooks.reached("restore:after-link")
    except FileExistsError:
        same = sha256_file(final) == expected
    os.unlink(part)  # our own part: its bytes are now at final, or another file stands there
    if not same:
        raise ConflictError(f"{final} appeared while it was being restored and does not match the archive's "
                            "declaration; it was left as it is", path=str(final),
                            remedy="move that file aside (or publish it as a new artifact), then rerun")


def _settle_parts(jobs: list, committed: set[str], no_clobber: bool, mtime_ns: int | None) -> None:
    """After a failed batch, the parts of files not committed: one that holds its whole file and hashes to
    the declared digest is committed like any other (the stream stopped before its turn); one a rerun
    could not resume from (no contiguous prefix worth re-verifying, ``stage.resumable_prefix``, or whole
    but wrong) is removed; a partial one with such a prefix stays for the rerun. Best effort: the batch's
    own failure is what is raised."""
    for entry, final, part, _, _ in jobs:
        if entry.path in committed:
            continue
        try:
            prefix = stage.resumable_prefix(part, entry.size)
            if prefix == entry.size and sha256_file(part).sha256 == entry.sha256:
                if payload_fsync_enabled():
                    fsync_file(part)
                put_in_place(part, final, FileDigest(entry.size, entry.sha256), no_clobber=no_clobber,
                             mtime_ns=mtime_ns)
                committed.add(entry.path)
            elif prefix == 0 or prefix == entry.size:
                part.unlink(missing_ok=True)
        except OSError as exc:  # ConflictError included
            log.warning("could not settle %s after the failed download: %s", part, exc)


def download_files(store: ObjectStore, prefix: str, staged: Path, todo: list[FileEntry], *,
                   where: Callable[[str], str], progress: bool | None = None,
                   no_clobber: bool = False, parts: Mapping[str, PartDigests] | None = None,
                   mtime_ns: int | None = None) -> tuple[int, list[dict]]:
    """Download every ``todo`` entry to ``staged/<path>``, verified; return (bytes received, ranged resumes).

    ``where(path)`` names an object in messages; ``no_clobber``: never replace a file at a final path
    (see the module docstring); ``parts``: the declared part digests by path (``FetchPlan.part_digests``);
    ``mtime_ns``: the modification time each file gets before it is put in place. Raises on the first failure once the work already
    running has returned (files verified and renamed by then stay in place; a rerun keeps them); a
    full disk raises ``OutOfSpace`` naming the file it stopped.
    """
    committed: set[str] = set()  # stage-relative paths verified and renamed into place by this run
    try:
        return _download(store, prefix, staged, todo, where=where, progress=progress, committed=committed,
                         no_clobber=no_clobber, parts=parts or {}, mtime_ns=mtime_ns)
    except OSError as exc:
        if not space.is_full(exc) or isinstance(exc, OutOfSpace):
            raise
        rest = [e for e in todo if e.path not in committed]
        parts = [p for e in rest for p in stage.leftover_parts(staged / e.path)]
        # The failed write names its file (the transfer layer and the commit below set ``filename``).
        raise space.out_of_space(exc, staged, space.path_in(exc, staged), rest,
                                 verified=len(committed), freed=parts) from exc


def _download(store: ObjectStore, prefix: str, staged: Path, todo: list[FileEntry], *,
              where: Callable[[str], str], progress: bool | None, committed: set[str],
              no_clobber: bool, parts: Mapping[str, PartDigests], mtime_ns: int | None) -> tuple[int, list[dict]]:
    jobs = []
    checked = {e.path: parts[e.path] for e in todo
               if e.path in parts and (parts[e.path].size, parts[e.path].sha256) == (e.size, e.sha256)}
    for entry in sorted(todo, key=lambda e: (-e.size, e.path)):
        final = staged / entry.path
        final.parent.mkdir(parents=True, exist_ok=True)
        part, offset = stage.claim_part(final, entry.size)
        if entry.path in checked:  # resumed after its whole parts that check; nothing hashed whole
            offset = stage.verified_prefix(part, offset, checked[entry.path]) if offset else 0
            hasher = None
        else:
            hasher = stage.hash_prefix(part, offset) if offset else None
        jobs.append((entry, final, part, offset if hasher is not None or entry.path in checked else 0, hasher))
    resumed = [{"path": e.path, "offset": off} for e, _, _, off, _ in jobs if off]

    whole_again = threading.Lock()
    with ByteProgress(sum(e.size - off for e, _, _, off, _ in jobs), "fetch", progress) as bar:
        def commit(index: int, got: FileDigest) -> None:
            """On a commit thread while later files download: check, flush, rename into place."""
            entry, final, part, offset, _ = jobs[index]
            expected = FileDigest(entry.size, entry.sha256)
            key = object_key(prefix, entry.path)
            try:
                if offset and got != expected:
                    log.warning("resumed download of %s did not verify; downloading it whole", where(entry.path))
                    with whole_again:  # one at a time: each has a range window of its own
                        bar.grow(offset)  # the prefix is fetched again
                        got = store.download_file(key, part, size=entry.size,
                                                  progress=_FileProgress(bar, entry.path, 0))
                if got != expected:
                    raise VerificationFailed(
                        f"{where(entry.path)} downloaded as {got.size} bytes sha256 {got.sha256}, but the archive "
                        f"declares {entry.size} bytes sha256 {entry.sha256}; the partial download was removed",
                        remedy="the archived object is damaged or was replaced; restore it or republish the artifact")
                if payload_fsync_enabled():
                    fsync_file(part)  # durable before the rename commits it (CKPTFLOW_FSYNC=0 skips)
                put_in_place(part, final, expected, no_clobber=no_clobber, mtime_ns=mtime_ns)
            except VerificationFailed:
                part.unlink(missing_ok=True)
                raise
            except OSError as exc:  # a flush can be where a full disk shows (NFS, some quotas)
                if exc.filename is None:
                    exc.filename = str(part)
                raise
            committed.add(entry.path)
            testhooks.reached("fetch:after-file")
            testhooks.reached(f"fetch:after-file:{entry.path}")

        files = [
            RangedFile(part, entry.size, partial(store.open_range, object_key(prefix, entry.path)), start=offset,
                       hasher=hasher, progress=_FileProgress(bar, entry.path, entry.size - offset),
                       source=where(entry.path), parts=checked.get(entry.path))
            for entry, _, part, offset, hasher in jobs
        ]
        try:
            download_batch(files, concurrency=download_connections(store), range_size=download_range_size(store), finish=commit)
        except BaseException:
            _settle_parts(jobs, committed, no_clobber, mtime_ns)
            raise
        finally:
            for _, _, part, _, _ in jobs:
                stage.unclaim_part(part)
    for _, final, _, _, _ in jobs:
        for leftover in stage.leftover_parts(final):  # older parts of files now in place
            leftover.unlink(missing_ok=True)
    return bar.done, resumed
