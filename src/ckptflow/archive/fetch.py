"""Fetch: read an archived artifact back into ``STAGE/iter_N``, verified, resumable and owned.

``fetch_artifact`` is the one function the CLI, the materializer and the workflow call. Order:

1. Read the remote declaration ``.posttrain-archive.json`` and the manifest before anything local
   happens, and validate both (every path relative, POSIX, inside the stage; sizes; digests). The
   declaration is the authoritative inventory of the manifest's physical files, DCP shards included:
   a declared object missing from the store is a named failure, never a smaller artifact. The merge
   record, a legacy-manifest record and the merge diagnostic are archived but are not model
   components: they are not fetched (reported as ``not_fetched``).
2. Decide what the stage is (``stage.read_own_record``): absent or empty (fetch), this tool's copy of
   the same source (resume, or already staged), this tool's copy of another source (replace: only the
   files its record names are removed), or foreign (refused, untouched). Files of an own copy are
   re-hashed and kept when they match; objects still to download are HEAD-checked, and the free space
   of the stage's file system must hold them (``space.check_space``: ``InsufficientSpace`` names the
   stage, the bytes needed and free). All of this is read-only: a refusal or failure here leaves the
   stage byte-identical.
3. Write ``.staged.json`` with ``complete: false`` naming every file of the new inventory (ownership
   is claimed before the first byte lands), download each payload through a process-unique ``.part``
   (hashed while written, one pass), check size and sha256, rename into place; then the manifest;
   then the record again with ``complete: true``, last. A disk that fills meanwhile (another writer) fails
as ``OutOfSpace`` naming the file being written; files verified by then stay, and the rerun resumes.

The source is the archive's declaration, not the URI it was read at: a copy of the same archive at another
destination a receipt lists (same declaration digest and inventory) is the same source, so a stage left by
a fetch from one is resumed from another and the record then names the URI of the latest fetch (a legacy
archive, without a declaration, is named by its URI). A complete copy of the same source is ``already-staged``
only after every payload re-hashed to its declared sha256 (files in parallel, ``digest.hash_files``):
the answer vouches for content, and a file changed in place with its size kept is downloaded again
(``resumed``). Nothing is written for a copy that matches.

Concurrent fetches into one stage are serialised by ``STAGE/iter_N.lock`` (``ckptflow.lock``: flock,
naming its holder; waited for up to ``lock_wait_seconds``, then refused by name). The decision of step 2
is taken once without the lock (so a refusal or an intact copy leaves nothing behind) and again under it,
so a fetch that waited sees what the other one wrote (typically: ``already-staged``). Because ``flock``
may be a no-op on a cluster file system, the lock is not the guarantee: every removal re-checks that the
file is still the one judged (inode, size, mtime; ``stage.unlink_if_judged``), a file that appeared
meanwhile is hashed and kept when it verifies, and ``complete: true`` is written only while every file
of the inventory is in place with its size.

Subsets: ``components`` (``ckptflow fetch --only model``; materialize asks for ``model``, all a teacher
build reads) stages those components' files and the manifest only. The declaration and the manifest are
read and checked whole, as for a full fetch; the record names the components (``.staged.json``
``components``) and ``complete`` vouches for their files alone. A complete own copy that holds the
requested scope (the whole artifact, or a subset naming every requested component) is ``already-staged``
once the *requested* files re-hash, nothing written. Otherwise an own copy's scope only grows: the new
scope is the union of the record's and the request's, so a full fetch into a subset stage downloads only
the rest (verified files are re-hashed and kept), and a subset request into an unfinished whole copy
finishes the whole copy (every file it claimed stays claimed and is verified before ``complete``).

Ranged resume: a ``.part`` left by a killed fetch (same host, dead pid) continues from the end of its
contiguous data (``stage.resumable_prefix``). Per-range digests do not exist, so the prefix cannot be
proven on its own: its bytes are re-read into the hasher and the *whole-file* digest is checked at the
end, like any download. If that check fails the part is discarded and the file downloaded once more
from byte 0; only a mismatch of that whole download is an error (the part is removed). Files are
streamed back to back and renamed as each is verified, so a killed fetch may leave later files whole
in their parts: the rerun re-hashes them and downloads nothing more for them.

Legacy archives (no declaration) are readable only for ``file`` components whose digest comes from the
manifest or the object's ``sha256`` metadata; a DCP component without a declaration is refused (a
listing cannot prove every shard is present), and so is a file with no digest anywhere.

Modules: this one orders the steps; ``fetch_plan.py`` reads and checks the archive's records (step 1);
``stage.py`` owns the local directory (ownership, leftover parts, removal of own files); ``download.py``
moves and verifies the bytes.

Test points (``testhooks``): ``fetch:lock-wait`` (another fetch holds the stage's lock; the guard
``fetch:lock`` switches the lock off), ``fetch:after-record``, ``fetch:mid-file:<path>`` (after the first
range of a file that has more), ``fetch:after-file`` and ``fetch:after-file:<path>``,
``fetch:before-manifest``, ``fetch:before-complete``. A pause point pauses only the thread that reaches it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from .. import testhooks
from ..artifact import ITER_DIR_RE
from ..digest import FileDigest, hash_files
from ..errors import (
    ConflictError,
    OutOfSpace,
    Refused,
    VerificationFailed,
)
from ..fsutil import name_max, restorable_name_problem
from ..lock import DEFAULT_WAIT_SECONDS
from ..records import manifest as manifest_record
from ..records import staging as staging_record
from ..records.inventory import FileEntry
from ..store import Credentials, StoreURI
from ..store.base import ObjectStore
from ..store.open import open_uri
from . import space, stage
from .download import download_files
from .fetch_plan import FetchPlan, read_plan, require_remote
from .keys import parse_artifact_uri

log = logging.getLogger(__name__)

STATUSES = ("fetched", "resumed", "already-staged", "replaced")


@dataclass
class FetchResult:
    status: str  # one of STATUSES
    path: Path  # STAGE/iter_N
    plan: FetchPlan
    downloaded: list[str] = field(default_factory=list)
    downloaded_bytes: int = 0
    reused: list[str] = field(default_factory=list)
    resumed: list[dict] = field(default_factory=list)  # [{"path", "offset"}] ranged resumes
    removed: list[str] = field(default_factory=list)
    left_beside: list[str] = field(default_factory=list)

    @property
    def inventory(self) -> tuple[FileEntry, ...]:
        return self.plan.inventory

    def to_report(self) -> dict:
        inventory = self.inventory
        return {
            "status": self.status,
            "path": str(self.path),
            "source_uri": str(self.plan.source),
            "iteration": self.plan.iteration,
            "declaration_sha256": self.plan.declaration_sha256,
            "legacy": self.plan.declaration_sha256 is None,
            "components": list(self.plan.components) if self.plan.components is not None else None,
            "inventory": [e.to_dict() for e in inventory],
            "total_bytes": sum(e.size for e in inventory),
            "downloaded": self.downloaded,
            "downloaded_bytes": self.downloaded_bytes,
            "reused": self.reused,
            "resumed": self.resumed,
            "removed": self.removed,
            "left_beside": self.left_beside,
            "not_fetched": list(self.plan.not_fetched),
        }


# --------------------------------------------------------------------------------------------- source


def _open_source(artifact_uri, store, credentials) -> tuple[ObjectStore, StoreURI, str, str]:
    artifact = parse_artifact_uri(artifact_uri)
    store, prefix = open_uri(artifact.uri, store, credentials)
    return store, artifact.uri, prefix, artifact.name


# --------------------------------------------------------------------------------------------- fetch


def fetch_artifact(
    artifact_uri: str | StoreURI,
    dst: Path | str,
    *,
    store: ObjectStore | None = None,
    credentials: Credentials | None = None,
    progress: bool | None = None,
    reserve: int = 0,
    reserve_for: str = "",
    lock_wait_seconds: float = DEFAULT_WAIT_SECONDS,
    components: Iterable[str] | None = None,
    declaration_sha256: str | None = None,
    declared_by: str = "",
) -> FetchResult:
    """Fetch the artifact at ``artifact_uri`` into ``dst/iter_N``; see the module docstring for the order.

    ``components`` (None: the whole artifact) names the manifest components to stage, e.g. ``{"model"}``
    for what a teacher build reads; see "Subsets" in the module docstring.

    ``store`` (optional) is an open store of the URI's bucket (for ``file://``: of a directory holding
    it); otherwise one is opened from the URI with ``credentials`` (None: the default chain; unused for file://).
    ``progress``: None shows bars when stderr is a terminal (or ``CKPTFLOW_PROGRESS=1``). ``reserve``
    bytes must stay free on the stage's file system after the fetch, for ``reserve_for`` (the caller's
    next step there): the free-space check counts them. ``lock_wait_seconds``: how long to wait for
    another fetch holding ``dst/iter_N.lock`` before refusing by its holder's name. ``declaration_sha256``
    (a receipt's, named ``declared_by``): the archive's declaration must hash to it, checked before anything
    local happens (``copies.fetch_from_receipt``).
    """
    store, uri, prefix, name = _open_source(artifact_uri, store, credentials)
    staged = Path(os.path.abspath(dst)) / name
    plan = read_plan(store, prefix, uri, iteration=int(ITER_DIR_RE.match(name).group(1)), components=components)
    if declaration_sha256 is not None and plan.declaration_sha256 != declaration_sha256:
        raise VerificationFailed(f"the declaration at {uri} hashes to {plan.declaration_sha256}, not the "
                                 f"{declaration_sha256} {declared_by} records; nothing was written",
                                 remedy="the archive there was replaced or damaged; fetch from another copy")
    problem = restorable_name_problem([e.path for e in plan.inventory], name_max(staged))
    if problem is not None:
        raise Refused(f"{uri} cannot be written into {staged}: {problem}; nothing was written",
                      remedy="fetch into a case-sensitive file system whose names are long enough, or republish the "
                      "artifact with other names")
    # Decided once without the lock (a refusal or an intact copy then leaves no lock file behind), and
    # again under it: another fetch may have written the stage meanwhile. Files unchanged since the
    # first pass (same inode, size, mtime) are not hashed twice.
    decision = _decide(store, plan, staged, progress, reserve, reserve_for, {})
    if decision.result.status == "already-staged":
        return decision.result
    with stage.stage_lock(staged, lock_wait_seconds):
        decision = _decide(store, plan, staged, progress, reserve, reserve_for, decision.hashed)
        if decision.result.status == "already-staged":
            return decision.result
        result, todo = decision.result, decision.todo
        # First write. Everything above only read.
        try:
            _write(store, staged, decision, progress=progress)
        except OSError as exc:
            if not space.is_full(exc) or isinstance(exc, OutOfSpace):
                raise
            rest = [e for e in todo if not os.path.lexists(staged / e.path)]
            raise space.out_of_space(exc, staged, space.path_in(exc, staged), rest,
                                     verified=len(todo) - len(rest)) from exc
    return result


@dataclass
class _Decision:
    """What one read-only look at the stage found, and the state of each file it judged."""

    result: FetchResult  # its plan is the scope this fetch stages: the request's, widened to an own copy's
    same: bool  # the stage holds this tool's copy (of any scope) of this very source
    old: tuple[FileEntry, ...] | None  # the record's files of another source, to be removed (a replacement)
    todo: list[FileEntry]
    judged: dict[str, tuple | None]  # path -> stage.file_key when judged (None: absent)
    hashed: dict[str, tuple[tuple, FileDigest]]  # path -> (file_key, digest) of every file hashed


def _own_copy(plan: FetchPlan, record: staging_record.StagingRecord | None) -> bool:
    """The record is this tool's copy of this very archive, and names exactly the files its scope (whole, or
    the components it names) has in it. The archive is its declaration: a copy of it at another destination
    (``publish --add-destination``) has the same digest, so a stage one destination left half-fetched is
    completed (its files re-hashed) from another. A legacy archive has no declaration: its URI names it."""
    if record is None or record.declaration_sha256 != plan.declaration_sha256:
        return False
    if plan.declaration_sha256 is None and record.source_uri != str(plan.source):
        return False
    return record.files == plan.inventory_of(record.components)


def _covers(record: staging_record.StagingRecord, plan: FetchPlan) -> bool:
    return record.whole or (plan.components is not None and set(plan.components) <= set(record.components))


def _decide(store: ObjectStore, plan: FetchPlan, staged: Path, progress, reserve: int, reserve_for: str,
            hashed: dict[str, tuple[tuple, FileDigest]]) -> _Decision:
    """Read-only: what the stage is, which own files verify, what to download; refusals touch nothing."""
    record = stage.read_own_record(staged)
    same = _own_copy(plan, record)
    if same and record.complete and _covers(record, plan):
        # A complete copy holding the requested scope: only that scope is re-hashed (a teacher's build
        # does not read the optimizer state to learn that model.pt is intact).
        quick = _judge(store, plan, staged, record, progress, hashed)
        if quick.todo == [] and (staged / manifest_record.FILENAME).read_bytes() == plan.manifest_bytes:
            quick.result.status = "already-staged"
            quick.result.left_beside = stage.unowned_files(staged, {e.path for e in record.files})
            return quick
        hashed = quick.hashed
    if same:  # an own copy's scope never shrinks: its files stay claimed, and verified when complete
        plan = plan.scoped(None if record.whole or plan.components is None
                           else {*record.components, *plan.components})
    decision = _judge(store, plan, staged, record, progress, hashed)
    require_remote(store, plan, decision.todo)
    space.check_space(staged, decision.todo, source=str(plan.source), extra=len(plan.manifest_bytes),
                      freed=_freed(staged, decision.todo, decision.old or (), same),
                      reserve=reserve, reserve_for=reserve_for)
    return decision


def _judge(store: ObjectStore, plan: FetchPlan, staged: Path, record, progress,
           hashed: dict[str, tuple[tuple, FileDigest]]) -> _Decision:
    """The stage against ``plan``'s scope: which files are in the way (refused), which own files verify."""
    inventory = plan.inventory
    same = _own_copy(plan, record)
    old = record.files if record is not None and not same else ()
    owned = {e.path for e in record.files} if record is not None else set()
    stage.check_room(staged, [e.path for e in inventory], owned)
    stage.check_removable(staged, old)
    # Each file is judged by its state (inode, size, mtime) before it is hashed; a removal later
    # re-checks that state, so a file another fetch put in place meanwhile is never what is removed.
    judged = {e.path: stage.file_key(staged / e.path) for e in (*plan.payloads, *old)}
    # An own copy of this source is re-hashed, complete or not: sizes alone do not vouch for content.
    present = [e.path for e in plan.payloads if same and e.path in owned and stage.files_in_place(staged, [e])]
    digests = {p: hashed[p][1] for p in present if p in hashed and hashed[p][0] == judged[p]}
    fresh = [p for p in present if p not in digests]
    if fresh:
        digests.update(hash_files(staged, fresh, progress=progress, desc="fetch re-verify"))
    by_path = {e.path: e for e in plan.payloads}
    result = FetchResult("fetched", staged, plan)
    result.reused = [p for p in present if digests[p] == FileDigest(by_path[p].size, by_path[p].sha256)]
    todo = [e for e in plan.payloads if e.path not in result.reused]
    return _Decision(result, same, old if record is not None and not same else None, todo, judged,
                     {**hashed, **{p: (judged[p], d) for p, d in digests.items()}})


def _freed(staged: Path, todo: list[FileEntry], old, same: bool) -> list[Path]:
    """Files this fetch removes or truncates before it needs their space: the dead parts of the files to
    download (a resumed one keeps only its prefix), an own file that no longer matches, a replaced copy."""
    paths: list[Path] = []
    for entry in (*todo, *old):
        final = staged / entry.path
        with contextlib.suppress(OSError):  # a parent that is a file (an own copy of another shape)
            paths += stage.leftover_parts(final)
        if same or entry in old:
            paths.append(final)
    return paths


def _write(store: ObjectStore, staged: Path, decision: _Decision, *, progress: bool | None) -> None:
    """Everything fetch writes, in order: removal of a replaced copy, the claim, payloads, manifest, record."""
    result = decision.result
    plan = result.plan
    uri, inventory = plan.source, plan.inventory
    if decision.old is not None:
        result.status = "replaced"
        result.removed = stage.remove_recorded_files(staged, decision.old, judged=decision.judged)
    elif decision.same:
        result.status = "resumed"
    staged.mkdir(parents=True, exist_ok=True)
    claim = staging_record.StagingRecord(str(uri), plan.declaration_sha256, inventory, complete=False,
                                         components=plan.components)
    staging_record.write_staging(staged, claim)
    testhooks.reached("fetch:after-record")
    todo = list(decision.todo)
    if decision.same:
        for entry in decision.todo:
            if stage.clear_unverified(staged, entry, decision.judged.get(entry.path)):
                todo.remove(entry)
                result.reused = sorted([*result.reused, entry.path])
    decision.todo[:] = todo
    result.downloaded_bytes, result.resumed = download_files(
        store, plan.prefix, staged, todo, where=plan.where, progress=progress, parts=plan.part_digests)
    result.downloaded = sorted(e.path for e in todo)
    testhooks.reached("fetch:before-manifest")
    stage.write_via_part(staged / manifest_record.FILENAME, plan.manifest_bytes)
    testhooks.reached("fetch:before-complete")
    missing = [e.path for e in inventory if not stage.files_in_place(staged, [e])]
    if missing:  # `complete` is never written while a file it names is not in place
        raise ConflictError(f"{staged / missing[0]} was removed or changed while this fetch ran "
                            f"({len(missing)} file(s)); {staging_record.FILENAME} stays incomplete",
                            path=str(staged / missing[0]), remedy="let the other process finish, then rerun the fetch")
    staging_record.write_staging(
        staged, replace(claim, complete=True))
    result.left_beside = stage.unowned_files(staged, {e.path for e in inventory})
