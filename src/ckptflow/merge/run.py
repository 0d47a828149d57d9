"""``merge_experts``: the library entry point of ``ckptflow merge``.

Order of work (each step only after the previous one succeeded)::

    check arguments -> take the output's lock -> read base identity -> hash experts -> decide (skip / build / refuse)
    -> open experts (mmap) and base, normalise layouts, refuse mismatches    (nothing written so far)
    -> write model.pt into a unique temporary beside it, one tensor at a time, fsync, verify
    -> re-check the directory against what the decision saw (decide again if it changed)
    -> write the in-progress marker naming the model.pt replaced and the temporary (their file identities)
    -> remove the previous record, manifest and diagnostics this build replaces
    -> rename the temporary to model.pt -> diagnostics -> native manifest -> .merge-complete.json
    -> remove the in-progress marker

A kill at any point leaves the old committed output, or a directory without ``.merge-complete.json``
that the same command rebuilds (the marker proves the record-less model.pt is the merge's own; a
model.pt nothing proves is refused, see ``identity``). Temporaries of dead processes on this host are removed on the next build.
When no merge record is there, the decision cannot depend on the request, so the experts are hashed in
a background thread while the merge runs; ``_check_unchanged`` proves the files hashed are the files
merged (same inode, size and mtime before hashing and after the write).

One merger per output: the whole request (decision, build, commit) runs under ``iter_N.merge.lock``
beside the artifact directory (``ckptflow.lock``: pid, host and start time of its holder; a second
request waits up to ``--lock-wait-seconds``, then is refused naming it). The lock is an optimisation, not
the guarantee (``flock`` may be a no-op on a cluster file system): just before its commit a build compares
the directory with what it saw when it decided and, if anything changed (another merge committed, the
artifact was published), decides again from what is there now (skip, refuse, or build over it).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .. import __version__, testhooks
from ..artifact import (
    ARTIFACTS_DIR,
    ITER_DIR_RE,
    archived_artifact_of,
    clear_stale_merge_marker,
    iteration_from_dir,
)
from ..digest import FileDigest, default_workers, sha256_file
from ..errors import (
    CkptflowError,
    ConflictError,
    InvalidRecord,
    NotFound,
    Refused,
    UnsafePath,
    UsageError,
    VerificationFailed,
)
from ..fsutil import atomic_write_bytes, dead_temporaries, fsync_dir, unique_temp_path
from ..jsonio import encode_json
from ..lock import DEFAULT_WAIT_SECONDS, artifact_key, check_wait_seconds, held_lock, reading
from ..progress import ByteProgress
from ..records import manifest as manifest_record
from ..records import merge_progress, merge_record
from ..records.inventory import FileEntry
from ..records.merge_record import BaseIdentity, Expert, MergeRecord, MergeRequest
from .build import plan_merge, write_merged
from .identity import MODEL_NAME, PRODUCER, Decision, decide, decide_without_record, directory_state
from .methods import METHODS
from .reader import BaseModel

log = logging.getLogger("ckptflow.merge")
# 1 MiB reads hash as fast as 8 MiB ones; larger freed buffers make glibc keep heap memory (see methods.Workspace).
HASH_CHUNK = 1 << 20


@dataclass
class MergeResult:
    status: str  # "built" or "skipped"
    reason: str
    artifact_dir: Path
    out: Path
    request: MergeRequest
    identity: str
    replaced_identity: str | None
    model: FileEntry
    diag: Path | None
    base_dir: Path | None = None
    layout: str | None = None
    inputs_normalised: bool = False
    tensors: int | None = None
    removed_temporaries: list[str] = field(default_factory=list)


def merge_experts(
    mode: str,
    experts: Sequence[str | Path],
    out: str | Path,
    *,
    base: str | Path | None = None,
    lam: float | None = None,
    iteration: int | None = None,
    diag: str | Path | None = None,
    force: bool = False,
    progress: bool | None = None,
    lock_wait_seconds: float = DEFAULT_WAIT_SECONDS,
) -> MergeResult:
    """Merge ``experts`` into ``out`` (``<...>/iter_N/model.pt``) and commit the artifact.

    ``mode`` is ``"avg"`` (uniform average; no base) or ``"tv"`` (``base + lam * sum(expert - base)``,
    ``lam`` defaulting to 1.0, ``base`` a Hugging Face directory). Returns what was done; raises
    ``UsageError`` for inconsistent arguments and ``Refused`` when the request must not run (also when
    another merge of the same output still holds its lock after ``lock_wait_seconds``).
    """
    out, experts_abs, base_dir, lam, diag_path = _check_arguments(mode, experts, out, base, lam, diag)
    wait = check_wait_seconds(lock_wait_seconds)
    dir_iteration = _check_output(out, iteration)
    artifact_dir = out.parent
    with held_lock(lock_path(artifact_dir), wait, step="merge", busy=f"{artifact_dir} is being merged by another request",
                   remedy="let that merge finish, then rerun (it skips once the same request is complete), "
                   "or raise --lock-wait-seconds"), _reading_experts(experts_abs):
        try:
            return _merge_locked(mode, experts_abs, out, base_dir, lam, dir_iteration, diag_path, force, progress)
        except FileNotFoundError as exc:
            gone = [p for p in experts_abs if not os.path.lexists(p)]
            if isinstance(exc, CkptflowError) or not gone:
                raise
            raise _expert_removed(gone[0], out) from None


@contextlib.contextmanager
def _reading_experts(experts: list[Path]) -> Iterator[None]:
    """Mark each expert's artifact directory (``checkpoint_artifacts/iter_N``, resolved) as read in place for
    the merge (``lock.reading``): a prune to a target keeps it while the merge hashes and reads its files."""
    dirs = {artifact_key(p).parent for p in experts}
    with contextlib.ExitStack() as held:
        for d in sorted(d for d in dirs if ITER_DIR_RE.match(d.name) and d.parent.name == ARTIFACTS_DIR):
            held.enter_context(reading(d))
        yield


def _expert_removed(path: Path, out: Path) -> NotFound:
    """The named failure of a merge whose expert file went away while it read it (nothing was committed)."""
    where = path.parent
    restore = (f"ckptflow restore --artifact-dir {where} refills it from its archive if it was pruned, or "
               if ITER_DIR_RE.match(where.name) else "")
    return NotFound(f"expert {path} was removed while the merge read it; nothing was committed to {out}",
                    path=str(path), remedy=f"put it back ({restore}restore it from where it came), then rerun the merge")


def lock_path(artifact_dir: Path) -> Path:
    """``iter_N.merge.lock`` beside the artifact directory: never inside it, so it is neither published
    nor pruned, and it exists before the directory does."""
    return artifact_dir.with_name(artifact_dir.name + ".merge.lock")


def _merge_locked(mode: str, experts_abs: list[Path], out: Path, base_dir: Path | None, lam: float | None,
                  dir_iteration: int, diag_path: Path | None, force: bool, progress: bool | None) -> MergeResult:
    artifact_dir = out.parent
    diag_rel = _relative_inside(diag_path, artifact_dir) if diag_path is not None else None
    if clear_stale_merge_marker(artifact_dir):  # a merge killed after its record: finish its cleanup
        log.info("removed the in-progress marker a killed merge left beside its record in %s", artifact_dir)
    seen = directory_state(artifact_dir)  # before deciding: any later change is seen by the commit's re-check

    base_model = BaseModel(base_dir) if base_dir is not None else None
    before = {p: _file_state(p) for p in experts_abs}

    def make_request(digests: dict[Path, FileDigest]) -> MergeRequest:
        return MergeRequest(
            mode=mode,
            experts=tuple(Expert(str(p), digests[p].size, digests[p].sha256) for p in experts_abs),
            base=BaseIdentity(base_model.config_sha256, base_model.index_sha256) if base_model else None,
            lam=lam,
            iteration=dir_iteration,
        )

    decision = decide_without_record(artifact_dir, force=force)
    hashing = None
    if decision is None:  # a completed merge is there: compare identities before anything else
        request = make_request(_hash_experts(experts_abs, progress))
        decision = decide(artifact_dir, request, diag=diag_path, diag_rel=diag_rel, force=force)
        if decision.action == "skip":
            return _skipped(decision, artifact_dir, out, request, diag_path, base_dir)
    else:  # nothing to compare with: hash the experts while the merge runs
        hashing, stop = ThreadPoolExecutor(max_workers=1, thread_name_prefix="merge-sha256"), threading.Event()
        pending = hashing.submit(_hash_experts, experts_abs, progress, stop)

    try:
        plan = plan_merge(mode, lam, experts_abs, base_model, diag=diag_path is not None)
        artifact_dir.mkdir(parents=True, exist_ok=True)
        removed = _remove_dead_temporaries(artifact_dir, {MODEL_NAME, manifest_record.FILENAME, merge_record.FILENAME,
                                                          merge_progress.FILENAME, *([diag_rel] if diag_rel else [])})
        tmp = unique_temp_path(out)
        try:
            model_digest, diag_doc = write_merged(plan, tmp, progress=progress)
            if hashing is not None:
                request = make_request(pending.result())
            _check_unchanged(before)
            testhooks.reached("merge:after-model-write")
            if directory_state(artifact_dir) != seen:  # another writer was here meanwhile: decide again
                decision = decide(artifact_dir, request, diag=diag_path, diag_rel=diag_rel, force=force)
                log.info("merge %s: %s changed while this request was built; now: %s", request.identity()[:12],
                         artifact_dir, decision.reason)
                if decision.action == "skip":
                    return _skipped(decision, artifact_dir, out, request, diag_path, base_dir)
            _commit(artifact_dir, out, tmp, request, model_digest, decision, diag_path, diag_rel, diag_doc)
        finally:
            if tmp.exists():
                tmp.unlink()
    finally:
        if hashing is not None:
            stop.set()  # a refused or failed build does not wait for the hashes
            hashing.shutdown(wait=True)
    identity = request.identity()
    model = FileEntry(MODEL_NAME, model_digest.size, model_digest.sha256)
    return MergeResult("built", decision.reason, artifact_dir, out, request, identity, decision.previous_identity,
                       model, diag_path, base_dir, layout=plan.layout, inputs_normalised=plan.normalised,
                       tensors=len(plan.outputs), removed_temporaries=removed)


def _skipped(decision: Decision, artifact_dir: Path, out: Path, request: MergeRequest, diag_path: Path | None,
             base_dir: Path | None) -> MergeResult:
    model = next(e for e in decision.previous.outputs if e.path == MODEL_NAME)
    log.info("merge %s: %s", request.identity()[:12], decision.reason)
    return MergeResult("skipped", decision.reason, artifact_dir, out, request, request.identity(),
                       None, model, diag_path, base_dir)


def _check_arguments(mode, experts, out, base, lam, diag):
    if mode not in METHODS:
        raise UsageError(f"--mode {mode!r} is not one of {sorted(METHODS)}")
    method = METHODS[mode]
    experts = [e for e in experts if str(e)]
    if not experts:
        raise UsageError("no experts given", remedy="pass --experts A,B,...")
    if mode == "avg" and len(experts) < 2:
        raise UsageError("--mode avg needs at least two experts", remedy="pass --experts A,B[,...]")
    if method.needs_base and base is None:
        raise UsageError(f"--mode {mode} needs --base", remedy="pass the Hugging Face base directory the experts came from")
    if not method.needs_base:
        for flag, value in (("--base", base), ("--lam", lam), ("--diag", diag)):
            if value is not None:
                raise UsageError(f"{flag} applies to --mode tv only", remedy=f"drop {flag} for --mode {mode}")
    else:
        lam = 1.0 if lam is None else float(lam)
        if not math.isfinite(lam):
            raise UsageError(f"--lam {lam} is not a finite number")
    out = Path(os.path.abspath(out))
    if out.name != MODEL_NAME:
        raise UsageError(f"--out {out} must name a file model.pt", remedy="pass --out <...>/iter_N/model.pt")
    iteration_from_dir(out.parent)
    experts_abs = [Path(os.path.abspath(e)) for e in experts]
    for path in experts_abs:  # compared by file identity: a symlinked directory or a hard link is the same file
        if path == out or (path.is_file() and _same_file(path, out)):
            raise UsageError(f"expert {path} is the output itself ({out})",
                             remedy="write the merge to another iter_* directory")
        if not path.is_file():
            archived = archived_artifact_of(path) if not path.exists() else None
            if archived is not None:
                raise NotFound(f"expert {path} was pruned after the archive of {archived} was verified (its manifest "
                               "and receipt stay)", path=str(path),
                               remedy=f"restore it first: `ckptflow restore --artifact-dir {archived}`, then merge again")
            raise NotFound(f"expert {path} does not exist or is not a file", remedy="check the --experts list")
    base_dir = Path(os.path.abspath(base)) if base is not None else None
    diag_path = Path(os.path.abspath(diag)) if diag is not None else None
    if diag_path is not None and (diag_path == out or _same_file(diag_path, out)
                                  or diag_path.name in (manifest_record.FILENAME, merge_record.FILENAME)):
        raise UsageError(f"--diag {diag_path} would overwrite a file the merge owns", remedy="choose another path")
    if diag_path is not None and any(_same_file(diag_path, p) for p in experts_abs):
        raise UsageError(f"--diag {diag_path} is one of the experts", remedy="choose another path")
    return out, experts_abs, base_dir, lam, diag_path


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are one file (device and inode), however they are spelled."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return False


def _check_output(out: Path, iteration: int | None) -> int:
    """The iteration of ``out``'s directory, after refusing a mismatched ``--iteration`` and unsafe paths."""
    artifact_dir = out.parent
    dir_iteration = iteration_from_dir(artifact_dir)
    if iteration is not None and iteration != dir_iteration:
        raise Refused(f"--iteration {iteration} does not match the output directory {artifact_dir.name}",
                      remedy=f"pass --iteration {dir_iteration}, or write to the iter_{iteration} directory")
    if artifact_dir.is_symlink() or (artifact_dir.exists() and not artifact_dir.is_dir()):
        raise UnsafePath(f"output directory {artifact_dir} is a symlink or not a directory", remedy="pass a real iter_* directory")
    if out.is_symlink() or out.is_dir():
        raise UnsafePath(f"{out} is a symlink or a directory", remedy="remove it; the merge writes a regular model.pt")
    return dir_iteration


def _relative_inside(path: Path, directory: Path) -> str | None:
    try:
        return path.relative_to(directory).as_posix()
    except ValueError:
        return None


class _Stopped(Exception):
    pass


def _hash_experts(paths: list[Path], progress: bool | None, stop: threading.Event | None = None) -> dict[Path, FileDigest]:
    unique = sorted(set(paths))
    with ByteProgress(sum(p.stat().st_size for p in unique), "merge: sha256 experts", progress) as bar:
        def on_bytes(n: int) -> None:
            if stop is not None and stop.is_set():
                raise _Stopped
            bar.update(n)

        def one(p: Path) -> tuple[Path, FileDigest]:
            return p, sha256_file(p, chunk_size=HASH_CHUNK, on_bytes=on_bytes)

        with ThreadPoolExecutor(max_workers=max(1, min(default_workers(), len(unique)))) as pool:
            return dict(pool.map(one, unique))


def _file_state(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _check_unchanged(before: dict[Path, tuple[int, int, int, int]]) -> None:
    """The experts merged are the files hashed: same inode, size and mtime as before hashing."""
    for path, state in before.items():
        if _file_state(path) != state:
            raise VerificationFailed(f"expert {path} changed while it was hashed and merged",
                                     remedy="rerun the merge once the expert is no longer being written")


def _remove_dead_temporaries(artifact_dir: Path, names: set[str]) -> list[str]:
    """Temporaries this tool left when it was killed: same host, process gone. Others are kept."""
    removed = []
    for path in dead_temporaries(artifact_dir, {f".{name}" for name in names}, ".tmp"):
        path.unlink()
        removed.append(path.name)
        log.info("removed %s left by a killed merge", path)
    return sorted(removed)


def _commit(artifact_dir: Path, out: Path, tmp: Path, request: MergeRequest, model: FileDigest,
            decision: Decision, diag: Path | None, diag_rel: str | None, diag_doc: dict | None) -> None:
    """Replace the previous output by the verified temporary and commit, record last."""
    record_path = merge_record.path_in(artifact_dir)
    manifest_path = manifest_record.path_in(artifact_dir)
    # The marker proves to a rerun that the record-less model.pt (the old one or the renamed temporary) is
    # one this build was allowed to replace or wrote itself.
    states = [merge_progress.FileState.of(tmp)]
    if out.is_file() and not out.is_symlink():
        states.insert(0, merge_progress.FileState.of(out))
    marker = merge_progress.MergeProgress(tuple(states))
    merge_progress.write_merge_progress(artifact_dir, marker)
    # From here the directory is uncommitted: a kill leaves something the same command rebuilds.
    for path in (record_path, manifest_path):
        if path.exists() or path.is_symlink():
            path.unlink()
    old_diag = decision.previous.diag if decision.previous is not None else None
    if old_diag is not None and old_diag != diag_rel and (artifact_dir / old_diag).is_file():
        (artifact_dir / old_diag).unlink()  # written by the merge being replaced, named by its record
    fsync_dir(artifact_dir)
    testhooks.reached("merge:after-record-removed")
    os.replace(tmp, out)
    fsync_dir(artifact_dir)
    testhooks.reached("merge:after-model-rename")
    outputs = [FileEntry(MODEL_NAME, model.size, model.sha256)]
    if diag is not None:
        data = encode_json(diag_doc)
        diag.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(diag, data)
        if diag_rel is not None:
            outputs.append(FileEntry(diag_rel, len(data), sha256_file(diag).sha256))
    manifest = manifest_record.Manifest.from_dict({
        "schema": manifest_record.SCHEMA,
        "iteration": request.iteration,
        "components": {"model": {"format": "file", "path": MODEL_NAME, "size": model.size, "sha256": model.sha256}},
        "producer": {"tool": PRODUCER, "version": __version__},
    })
    _require_own_marker(artifact_dir, marker)
    manifest_record.write_manifest(artifact_dir, manifest)
    testhooks.reached("merge:after-manifest")
    _require_own_marker(artifact_dir, marker)
    merge_record.write_merge_record(
        artifact_dir, MergeRecord(tool_version=__version__, request=request, outputs=tuple(outputs), diag=diag_rel)
    )
    testhooks.reached("merge:after-record")
    _require_own_marker(artifact_dir, marker)
    merge_progress.path_in(artifact_dir).unlink()  # ours: it names the model.pt this commit wrote and the one it replaced


def _require_own_marker(artifact_dir: Path, marker: merge_progress.MergeProgress) -> None:
    """Before each record this commit writes: the in-progress marker is still the one it wrote. One that is
    gone or names other files was written by a merge that committed into the same directory meanwhile (the
    lock was not effective): its files are left as they are and this merge writes no record over them."""
    path = merge_progress.path_in(artifact_dir)
    try:
        mine = merge_progress.read_merge_progress(path) == marker
    except (NotFound, InvalidRecord):
        mine = False
    if not mine:
        raise ConflictError(
            f"{artifact_dir}: another merge committed into this directory while this one did ({path} is not the "
            f"marker this merge wrote); the lock file {lock_path(artifact_dir)} is not effective on this file system",
            path=str(artifact_dir), remedy="rerun the merge: it completes, skips or refuses by the record now there, "
            "and mount the file system with flock support")

