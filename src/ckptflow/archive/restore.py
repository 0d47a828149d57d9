"""Restore: refill an artifact's missing payloads in place, from the archive its receipt names.

``restore_artifact`` is the one function the CLI (``ckptflow restore``) and the workflow (rule
``restore``) call. It is ``fetch`` aimed at the artifact directory itself, with its receipt as the source:

1. Read the local manifest and the JSON receipt (a legacy or full-checkpoint receipt is refused by name).
   A receipt may list several destinations (``publish --add-destination``): each is tried in the receipt's
   order (the current one first), or only those ``destinations`` names (``--destination URI``,
   ``destinations.select_destinations``), until one serves. At each, the receipt must belong to this artifact and
   the credentials must reach that destination (``destinations.check_binding``). The remote declaration must exist and hash to the receipt's
   ``declaration_sha256``: an archive that is gone (deleted bucket, removed ``file://`` root, objects
   deleted) is a ``NotFound`` naming the receipt and the destination. The declaration and the remote
   manifest are then read and checked like any fetch (``fetch_plan.read_plan``), and the remote manifest must be
   byte-identical to the local one.
2. Judge each payload file the manifest names (every component's files, DCP shards included; the records
   beside them are never pruned, so never restored): absent → to download; present → hashed, kept when it
   matches the declaration, and when it does not the whole restore is **refused by name** (a local file is
   never overwritten, whatever it holds). Something that is not a regular file where a payload or its
   directory belongs is refused too (``stage.check_room``). Every object still to download is HEAD-checked
   (``fetch_plan.require_remote``) and must fit on the file system (``space.check_space``). All of this is
   read-only: a refusal, and a ``dry_run``, write nothing anywhere (no lock file either).
3. Under the lock ``checkpoint_artifacts/iter_N.restore.lock`` (``lock.held_lock``; it avoids two restores
   downloading the same bytes, it is not the guarantee) judge again, then download through fetch's
   machinery (``download.download_files``): a process-unique ``.part`` per file, hashed while written,
   checked against the declared size and sha256, put in place with ``no_clobber`` (a link, never a rename
   over a file that appeared meanwhile). A killed restore leaves verified files in place and parts whose
   prefix the rerun re-hashes and continues from (``stage.claim_part``): the rerun downloads only what is
   missing. The manifest and the receipt are never written: they stay byte-identical and valid, so
   ``status`` shows the artifact local again and ``prune-verified`` can free it again.

What killed steps left is finished first (never in a dry run): a payload a killed prune set aside
(``release.put_back_asides``) gets its name back instead of being downloaded again. Once every payload
is in place and verified, the dead ``.part`` leftovers of those files (a restore killed between linking
a part into place and removing it, ``restore:after-link``) are removed, and so is a restore lock whose
holder was killed (``lock.remove_if_stale``): nothing a killed restore leaves blocks a later prune.

A destination that cannot serve (``copies.first_serving``: unreachable, its ``file://`` root gone, credentials that do not reach it,
its declaration or an object missing or damaged: anything about the archive, never a local refusal such
as a differing local file or too little space) is skipped with a warning naming it and why, and the next
one is tried: the files verified and put in place by then stay, so the next destination downloads only
the rest. The report names the destination that served (``destination``, ``source_uri``) and every one
skipped (``skipped_destinations``); when none serves, the error names each and why (with one destination,
its own error, as it was).

An artifact whose payloads are all present and verify is ``already-local`` (nothing downloaded, exit 0).
Statuses: ``restored`` (every missing file downloaded), ``already-local``, ``dry-run``.

Test points (``testhooks``): ``restore:lock-wait`` (another restore holds the lock; ``restore:lock``
switches it off), ``restore:before-download``, ``restore:after-link`` (a part linked into place, not yet
removed), ``restore:lock-created`` and ``restore:lock-release`` (``ckptflow.lock``), and the download's own
``fetch:mid-file:<path>`` and ``fetch:after-file:<path>``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import testhooks
from ..digest import FileDigest, hash_files
from ..errors import CkptflowError, ConflictError, NotFound, Refused, StoreError, VerificationFailed
from ..fsutil import require_directory
from ..lock import DEFAULT_WAIT_SECONDS, held_lock, remove_if_stale
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from ..records.inventory import FileEntry
from ..store.base import ObjectStore
from . import space, stage
from .copies import Unusable, first_serving
from .destinations import check_binding, select_destinations
from .download import download_files
from .fetch_plan import FetchPlan, read_plan, require_remote
from .keys import receipt_archive_uri
from .release import dead_asides, put_back_asides
from .verify import check_declaration

log = logging.getLogger(__name__)

STATUSES = ("restored", "already-local", "dry-run")


@dataclass
class RestoreResult:
    status: str  # one of STATUSES
    artifact_dir: Path
    source: str
    declaration_sha256: str
    payloads: tuple[FileEntry, ...]
    reused: list[str] = field(default_factory=list)  # present and verified, kept as they are
    missing: list[str] = field(default_factory=list)  # absent when this run judged the artifact
    downloaded: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    resumed: list[dict] = field(default_factory=list)  # [{"path", "offset"}] continued from a killed restore
    destination: receipt_record.ReceiptDestination | None = None  # the receipt's destination that served
    skipped: list[dict] = field(default_factory=list)  # [{"destination", "detail"}] tried before it, unusable

    def to_report(self) -> dict:
        """The ``restore`` report (schemas/report_restore.schema.json), for the CLI and the workflow alike."""
        sizes = {e.path: e.size for e in self.payloads}
        return {
            "status": self.status,
            "dry_run": self.status == "dry-run",
            "artifact_dir": str(self.artifact_dir),
            "source_uri": self.source,
            "destination": self.destination.to_dict() if self.destination is not None else None,
            "skipped_destinations": self.skipped,
            "declaration_sha256": self.declaration_sha256,
            "payloads": [e.to_dict() for e in self.payloads],
            "total_bytes": sum(sizes.values()),
            "reused": self.reused,
            "missing": self.missing,
            "missing_bytes": sum(sizes[p] for p in self.missing),
            "downloaded": self.downloaded,
            "downloaded_bytes": self.downloaded_bytes,
            "resumed": self.resumed,
        }


def restore_artifact(artifact_dir: Path | str, store_for, *, dry_run: bool = False, progress: bool | None = None,
                     lock_wait_seconds: float = DEFAULT_WAIT_SECONDS,
                     destinations: list[str] | tuple[str, ...] | None = None) -> RestoreResult:
    """Refill ``artifact_dir``'s missing payloads from a destination its receipt lists; see the module docstring.

    ``store_for(receipt_destination)`` opens the store a receipt destination names with the caller's
    credentials (``store.open.store_factory``). ``destinations`` (``--destination URI``, repeatable): only
    those of the receipt's destinations are tried; default every one, in the receipt's order."""
    artifact_dir = Path(os.path.abspath(require_directory(
        artifact_dir, "artifact directory", "pass the published checkpoint_artifacts/iter_N directory")))
    manifest_path, receipt, receipt_path = _read_records(artifact_dir)
    chosen = select_destinations(receipt, destinations, str(receipt_path))
    hashed: dict[str, tuple[tuple, FileDigest]] = {}
    earlier: list[_Unusable] = []  # what destinations that failed mid-download put in place, verified

    def attempt(dest: receipt_record.ReceiptDestination) -> RestoreResult:
        try:
            return _restore_from(artifact_dir, receipt.at(dest), receipt_path, manifest_path, store_for,
                                 dry_run=dry_run, progress=progress, lock_wait_seconds=lock_wait_seconds, hashed=hashed)
        except _Unusable as exc:
            earlier.append(exc)
            raise

    result, dest, skipped = first_serving(
        chosen, attempt, lister=str(receipt_path), serves=f"the restore of {artifact_dir}",
        after="; files already verified and in place were kept", path=str(receipt_path),
        remedy="make one of those copies reachable and whole (or name one with --destination), then rerun the restore")
    result.destination = dest
    result.skipped = [{"destination": s.destination.to_dict(), "detail": str(s.error)} for s in skipped]
    earlier_downloaded = [p for exc in earlier for p in exc.downloaded]
    if earlier_downloaded:  # this run's work all the same
        result.downloaded = sorted({*result.downloaded, *earlier_downloaded})
        result.downloaded_bytes += sum(exc.downloaded_bytes for exc in earlier)
        result.reused = sorted(set(result.reused) - set(earlier_downloaded))
        missing = next((exc.missing for exc in earlier if exc.missing is not None), None)
        if missing is not None:
            result.missing = missing
        if result.status == "already-local":
            result.status = "restored"
    return result


class _Unusable(Unusable):
    """The destination being tried cannot serve the restore: ``error`` says why (the next one is tried).
    A download that failed part way says what it had judged missing and put in place, verified, by then."""

    def __init__(self, error: CkptflowError | OSError, *, missing: list[str] | None = None,
                 downloaded: list[str] | None = None, downloaded_bytes: int = 0):
        super().__init__(error)
        self.missing = missing
        self.downloaded = downloaded or []
        self.downloaded_bytes = downloaded_bytes


# What a destination that cannot serve raises once its records were read: an object missing or not the
# declared bytes, or the store failing. A local refusal (a differing file, too little space, a busy lock)
# is none of these, and stops the restore whatever other destination there is.
_SOURCE_ERRORS = (NotFound, VerificationFailed, StoreError)


def _restore_from(artifact_dir: Path, receipt: receipt_record.Receipt, receipt_path: Path, manifest_path: Path,
                  store_for, *, dry_run: bool, progress: bool | None, lock_wait_seconds: float,
                  hashed: dict[str, tuple[tuple, FileDigest]]) -> RestoreResult:
    """The restore from the one destination ``receipt`` names (``Receipt.at``); ``_Unusable`` when that
    destination cannot serve it. ``hashed`` carries the local files' digests from one destination to the next."""
    try:
        store, plan = _read_source(artifact_dir, receipt, receipt_path, manifest_path, store_for)
    except (CkptflowError, OSError) as exc:  # it only read the archive: whatever failed is this destination's
        raise _Unusable(exc) from exc
    lock = artifact_dir.with_name(artifact_dir.name + ".restore.lock")
    paths = [e.path for e in plan.payloads]
    if not dry_run:
        put_back_asides(artifact_dir, paths)
        stand_in = {}
    else:  # what the real run puts back is judged where it lies now
        stand_in = {p: a for a, p in sorted(dead_asides(artifact_dir, paths).items(), reverse=True)
                    if not os.path.lexists(artifact_dir / p)}
    result = _judge(plan, artifact_dir, progress, hashed, stand_in)
    if not stand_in:
        hashed.update(result.hashed)
    if result.status == "already-local":
        if not dry_run:
            _clear_after(artifact_dir, plan.payloads, lock)
        return result
    _check_missing(store, plan, artifact_dir, result)
    if dry_run:
        result.status = "dry-run"
        return result
    with held_lock(lock, lock_wait_seconds, step="restore", busy=f"{artifact_dir} is being restored by another request",
                   remedy="let that restore finish, then rerun (it answers already-local once the payloads are "
                   "in place), or raise --lock-wait-seconds"):
        # Judged again under the lock: another restore may have put files in place meanwhile.
        result = _judge(plan, artifact_dir, progress, hashed)
        hashed.update(result.hashed)
        if result.status == "already-local":
            _clear_after(artifact_dir, plan.payloads, None)
            return result
        _check_missing(store, plan, artifact_dir, result)
        testhooks.reached("restore:before-download")
        todo = [e for e in plan.payloads if e.path in result.missing]
        try:
            result.downloaded_bytes, result.resumed = download_files(
                store, plan.prefix, artifact_dir, todo, where=plan.where, progress=progress, no_clobber=True,
                parts=plan.part_digests, mtime_ns=os.stat(manifest_record.path_in(artifact_dir)).st_mtime_ns)
        except _SOURCE_ERRORS as exc:  # files verified and put in place by then stay; the next destination has the rest
            placed = [e for e in todo if stage.files_in_place(artifact_dir, [e])]
            raise _Unusable(exc, missing=result.missing, downloaded=[e.path for e in placed],
                            downloaded_bytes=sum(e.size for e in placed)) from exc
        result.downloaded = sorted(e.path for e in todo)
    gone = [e.path for e in plan.payloads if not stage.files_in_place(artifact_dir, [e])]
    if gone:
        raise ConflictError(f"{artifact_dir / gone[0]} was removed or changed while this restore ran "
                            f"({len(gone)} file(s)); {receipt_path.name} and the manifest were not touched",
                            path=str(artifact_dir / gone[0]), remedy="let the other process finish, then rerun the restore")
    _clear_after(artifact_dir, plan.payloads, None)
    result.status = "restored"
    return result


def _clear_after(artifact_dir: Path, payloads: tuple[FileEntry, ...], lock: Path | None) -> None:
    """Every payload is in place and verified: remove the dead parts of those files and, given ``lock``, the
    restore lock when its holder was killed."""
    for entry in payloads:
        for part in stage.leftover_parts(artifact_dir / entry.path):
            part.unlink(missing_ok=True)  # this tool's part, writer gone; its file is in place and verified
            log.info("removed %s left by a killed restore", part)
    if lock is not None and remove_if_stale(lock):
        log.info("removed %s left by a killed restore", lock)


def _read_records(artifact_dir: Path) -> tuple[Path, receipt_record.Receipt, Path]:
    """The local manifest's path, the receipt and its path; refused by name when either is missing."""
    manifest_path = artifact_dir / manifest_record.FILENAME
    if not manifest_path.is_file():
        raise NotFound(f"{manifest_path} does not exist: {artifact_dir} is not a committed artifact",
                       remedy="pass a checkpoint_artifacts/iter_N directory holding its manifest; to get an artifact "
                       "with no local records back, use `ckptflow fetch`", path=str(manifest_path))
    manifest_record.read_manifest(artifact_dir)
    receipt_path = receipt_record.path_in(artifact_dir)
    if not os.path.lexists(receipt_path):
        raise NotFound(f"{receipt_path} does not exist: nothing records where {artifact_dir} was archived",
                       remedy="restore needs the receipt `ckptflow publish` wrote; with the archive's URI, "
                       "`ckptflow fetch` gets the artifact back into a stage", path=str(receipt_path))
    return manifest_path, receipt_record.read_receipt(artifact_dir), receipt_path


def _read_source(artifact_dir: Path, receipt: receipt_record.Receipt, receipt_path: Path, manifest_path: Path,
                 store_for) -> tuple[ObjectStore, FetchPlan]:
    """The store and the checked plan of the archive at the destination ``receipt`` names; reads only."""
    source = receipt_archive_uri(receipt)
    store = store_for(receipt.destination)
    check_binding(store, receipt, artifact_dir)
    prefix = receipt.destination.prefix
    declaration = check_declaration(store, prefix, receipt.declaration_sha256)
    if declaration.state == "missing":
        raise NotFound(f"{receipt_path} names the archive {source}, but its declaration {declaration.key} is not "
                       "there: the archive was deleted or moved; nothing was written",
                       remedy="put the archive back where the receipt says (or publish the artifact again from "
                       "another copy of its payloads)", path=str(receipt_path))
    if declaration.state != "ok":
        raise VerificationFailed(f"the declaration at {source} does not match {receipt_path} ({declaration.detail}); "
                                 "nothing was written", remedy="the archive was replaced or damaged; restore it from "
                                 "a backup, or keep what is local and publish it to a new destination")
    plan = read_plan(store, prefix, source, iteration=manifest_record.read_manifest(artifact_dir).iteration)
    if plan.declaration_sha256 != receipt.declaration_sha256 or plan.manifest_bytes != manifest_path.read_bytes():
        raise VerificationFailed(f"the archive at {source} holds another manifest or declaration than {artifact_dir} "
                                 f"and its receipt record; nothing was written",
                                 remedy="the archive was replaced; keep what is local and publish it to a new destination")
    return store, plan


@dataclass
class _Judged(RestoreResult):
    hashed: dict[str, tuple[tuple, FileDigest]] = field(default_factory=dict)  # path -> (file_key, digest)


def _judge(plan: FetchPlan, artifact_dir: Path, progress: bool | None,
           hashed: dict[str, tuple[tuple, FileDigest]], stand_in: dict[str, str] | None = None) -> _Judged:
    """Read-only and local: which payloads are missing, which verify; a present file that differs is refused.
    Files unchanged since an earlier judgement (same ``stage.file_key``) are not hashed twice. ``stand_in``
    (a dry run): an absent payload judged by the file a killed prune set aside, which the real run puts back."""
    payloads = plan.payloads
    stand_in = stand_in or {}
    # Every payload path counts as "ours" here: a regular file there is judged by its hash below, and
    # check_room refuses what is not a regular file, or a file where a directory is needed.
    stage.check_room(artifact_dir, [e.path for e in payloads], {e.path for e in payloads})
    keys = {e.path: stage.file_key(artifact_dir / stand_in.get(e.path, e.path)) for e in payloads}
    present = [e.path for e in payloads if keys[e.path] is not None]
    digests = {p: hashed[p][1] for p in present if p in hashed and hashed[p][0] == keys[p]}
    fresh = [p for p in present if p not in digests]
    if fresh:
        got = hash_files(artifact_dir, [stand_in.get(p, p) for p in fresh], progress=progress, desc="restore re-verify")
        digests.update({p: got[stand_in.get(p, p)] for p in fresh})
    by_path = {e.path: e for e in payloads}
    differ = [p for p in present if digests[p] != FileDigest(by_path[p].size, by_path[p].sha256)]
    if differ:
        got, want = digests[differ[0]], by_path[differ[0]]
        raise Refused(f"{artifact_dir / differ[0]} differs from the archive's declaration ({got.size} bytes sha256 "
                      f"{got.sha256}, declared {want.size} bytes sha256 {want.sha256})"
                      + (f" and so do {len(differ) - 1} more file(s)" if len(differ) > 1 else "")
                      + "; restore never overwrites a local file, nothing was written",
                      path=str(artifact_dir / differ[0]),
                      remedy="move the file aside (or publish the artifact as a new one), then rerun restore")
    result = _Judged("already-local", artifact_dir, str(plan.source), plan.declaration_sha256 or "", payloads,
                     hashed={**hashed, **{p: (keys[p], d) for p, d in digests.items()}})
    result.reused = sorted(present)
    result.missing = sorted(p for p in by_path if p not in digests)
    if result.missing:
        result.status = "restored"
    return result


def _check_missing(store: ObjectStore, plan: FetchPlan, artifact_dir: Path, result: RestoreResult) -> None:
    """Read-only: every missing payload's object is at the destination as declared (HEAD; ``_Unusable``
    otherwise), and the file system has room for them (a refusal of this restore, whatever the destination)."""
    todo = [e for e in plan.payloads if e.path in result.missing]
    try:
        require_remote(store, plan, todo)
    except _SOURCE_ERRORS as exc:
        raise _Unusable(exc) from exc
    space.check_space(artifact_dir, todo, source=str(plan.source),
                      freed=[p for e in todo if (artifact_dir / e.path).parent.is_dir()
                             for p in stage.leftover_parts(artifact_dir / e.path)])


def missing_payloads(artifact_dir: Path | str) -> list[str]:
    """The manifest's payload files absent from ``artifact_dir`` when it holds a receipt (what a restore would
    refill), from stats only; [] when there is no readable manifest or no receipt (nothing to restore from).
    The workflow plans ``restore_all`` with it; the restore itself re-judges everything."""
    artifact_dir = Path(artifact_dir)
    if not os.path.lexists(receipt_record.path_in(artifact_dir)):
        return []
    try:
        manifest = manifest_record.read_manifest(artifact_dir)
    except (CkptflowError, OSError):
        return []  # status names a damaged manifest; restore would refuse it by name
    return sorted(e.path for e in manifest.physical_files() if not os.path.lexists(artifact_dir / e.path))
