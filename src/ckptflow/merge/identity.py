"""What a merge request finds in its output directory, and what it may do there.

The request identity is the SHA-256 of the encoded request (mode, ordered experts with their sizes and
digests, base identity, lam, iteration; ``records.merge_record.request_identity``), together with the
tool version that wrote the record. Rules, in this order:

* a valid record of the same request and tool version whose outputs re-hash to what it lists (and
  whose native manifest names the same ``model.pt``) -> **skip**;
* no record -> the output is incomplete -> **build**, unless a native manifest that another program
  committed is there (a trainer's or ``seal``'s artifact): that is **refused** unless ``--force``;
  and a record-less ``model.pt`` is only replaced when merge provably wrote it: the in-progress marker
  ``.merge-in-progress.json`` names that very file (device, inode, size, mtime), or merge's own native
  manifest lists its size and SHA-256. Any other ``model.pt`` (a user's own, unsealed) is **refused**,
  even with ``--force``: it may be the only copy;
* a record of the same request whose ``model.pt`` was pruned after publication (absent, while the
  record, the native manifest and the receipt ``.uploaded`` agree on its size and digest and the receipt
  binds this very manifest and record: what ``prune-verified`` leaves) -> complete -> **skip**;
* a record of the same request whose outputs differ or are missing otherwise -> damaged -> **build**;
* a record of a different request, of another tool version, from an older tool (no protocol), or one
  that cannot be read -> **refused** unless ``--force``, naming both identities;
* whatever the above, a build in a directory that was published (``.uploaded`` or
  ``.posttrain-archive.json`` present) is **refused**: its bytes are bound to an archive.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import __version__
from ..digest import sha256_file
from ..errors import CkptflowError, InvalidRecord, NotFound, Refused
from ..records import declaration as declaration_record
from ..records import manifest as manifest_record
from ..records import merge_progress, merge_record
from ..records import receipt as receipt_record
from ..records.inventory import damaged_entry
from ..records.merge_record import LegacyRecord, MergeRecord, MergeRequest

PRODUCER = "ckptflow merge"
PUBLISHED_MARKERS = (receipt_record.FILENAME, declaration_record.FILENAME)
MODEL_NAME = "model.pt"


@dataclass(frozen=True, slots=True)
class Decision:
    action: str  # "skip" or "build"
    reason: str
    previous: MergeRecord | None = None  # a readable record this build replaces
    previous_identity: str | None = None


def short(identity: str) -> str:
    return identity[:12]


def describe_request(req: MergeRequest) -> str:
    experts = ", ".join(e.path for e in req.experts)
    lam = f", lam {req.lam}" if req.lam is not None else ""
    return f"{req.mode}{lam} of [{experts}] at iteration {req.iteration}"


def request_differences(old: MergeRequest, new: MergeRequest) -> list[str]:
    diffs = []
    if old.mode != new.mode:
        diffs.append(f"mode {old.mode} -> {new.mode}")
    if [e.path for e in old.experts] != [e.path for e in new.experts]:
        same_set = sorted(e.path for e in old.experts) == sorted(e.path for e in new.experts)
        diffs.append("expert order" if same_set else "expert paths")
    elif [e.sha256 for e in old.experts] != [e.sha256 for e in new.experts]:
        diffs.append("expert contents")
    if old.base != new.base:
        diffs.append("base")
    if old.lam != new.lam:
        diffs.append(f"lam {old.lam} -> {new.lam}")
    if old.iteration != new.iteration:
        diffs.append(f"iteration {old.iteration} -> {new.iteration}")
    return diffs


def decide(artifact_dir: Path, request: MergeRequest, *, diag: Path | None, diag_rel: str | None,
           force: bool) -> Decision:
    return _refuse_published(artifact_dir, _decide(artifact_dir, request, diag=diag, diag_rel=diag_rel, force=force))


def decide_without_record(artifact_dir: Path, *, force: bool) -> Decision | None:
    """The decision when no merge record is there to compare with (it then never depends on the
    request), or None: a record exists and ``decide`` needs the request's identity."""
    record_path = merge_record.path_in(artifact_dir)
    if record_path.exists() or record_path.is_symlink():
        return None
    if not artifact_dir.is_dir():
        return Decision("build", "no previous output")
    return _refuse_published(artifact_dir, _without_record(artifact_dir, force))


def _refuse_published(artifact_dir: Path, decision: Decision) -> Decision:
    if decision.action == "build":
        for marker in PUBLISHED_MARKERS:
            if (artifact_dir / marker).exists():
                raise Refused(
                    f"{artifact_dir} was published ({marker} present) and would be rebuilt ({decision.reason}); "
                    "a published artifact is never rewritten, not even with --force",
                    remedy="fetch the archived copy with `ckptflow fetch`, or merge into a new iter_* directory",
                )
    return decision


def _decide(artifact_dir: Path, request: MergeRequest, *, diag: Path | None, diag_rel: str | None,
            force: bool) -> Decision:
    record_path = merge_record.path_in(artifact_dir)
    identity = request.identity()
    if not (record_path.exists() or record_path.is_symlink()):
        return _without_record(artifact_dir, force)
    try:
        record = merge_record.read_merge_record(record_path)
    except LegacyRecord as exc:
        if not force:
            raise Refused(f"{record_path} was written by an older merge tool ({exc.message}); this request is "
                          f"{short(identity)} ({describe_request(request)})",
                          remedy="rerun with --force to rebuild it with this ckptflow, or use another iter_* directory") from None
        return Decision("build", "forced: replaces a record of an older merge tool")
    except InvalidRecord as exc:
        if not force:
            raise Refused(f"{record_path} cannot be read as a merge record ({exc})",
                          remedy="inspect it; rerun with --force to rebuild the merge over it") from None
        return Decision("build", "forced: replaces an unreadable merge record")
    old_identity = record.request.identity()
    if record.tool_version != __version__:
        if not force:
            raise Refused(
                f"{record_path} records request {short(old_identity)} built by ckptflow {record.tool_version}; "
                f"this is ckptflow {__version__} (request {short(identity)})",
                remedy="rerun with --force to rebuild it with this version, or use another iter_* directory",
            )
        return Decision("build", f"forced: replaces the output of ckptflow {record.tool_version}", record, old_identity)
    if old_identity != identity:
        if not force:
            raise Refused(
                f"{artifact_dir} holds the completed merge {short(old_identity)} "
                f"({describe_request(record.request)}); this request is {short(identity)} "
                f"({describe_request(request)}); they differ in: {', '.join(request_differences(record.request, request))}",
                remedy=f"rerun with --force to replace {short(old_identity)} by {short(identity)}, "
                "or merge into another iter_* directory",
            )
        return Decision("build", f"forced: replaces request {short(old_identity)}", record, old_identity)
    pruned = pruned_after_publication(artifact_dir, record)
    problem = (None if pruned else damaged_outputs(artifact_dir, record)) or _diag_problem(record, diag, diag_rel)
    if problem:
        return Decision("build", f"rebuilt: {problem}", record, old_identity)
    if pruned:
        return Decision("skip", f"the same request's output is complete: published ({receipt_record.FILENAME}) and "
                        f"its {MODEL_NAME} pruned after the archive was verified", record, old_identity)
    return Decision("skip", "the same request's output is complete and intact", record, old_identity)


def pruned_after_publication(artifact_dir: Path, record: MergeRecord) -> bool:
    """Whether ``model.pt`` is absent because it was pruned after a verified publication: the native
    manifest names the record's model.pt (size and digest), the receipt lists the same size and digest for
    it, and binds this very manifest and merge record (their bytes re-hashed) and every other recorded
    output, which is still here and intact. Anything else missing is damage, not a prune."""
    model = artifact_dir / MODEL_NAME
    if os.path.lexists(model) or not receipt_record.path_in(artifact_dir).is_file():
        return False
    try:
        receipt = receipt_record.read_receipt(artifact_dir)
        manifest = manifest_record.read_manifest(artifact_dir)
    except (CkptflowError, OSError):  # no artifact receipt (legacy, full-checkpoint, unreadable): no proof
        return False
    outputs = {e.path: e for e in record.outputs}
    component = manifest.components.get("model")
    recorded = outputs.get(MODEL_NAME)
    if recorded is None or component is None or component.path != MODEL_NAME or (
            getattr(component, "size", None), getattr(component, "sha256", None)) != (recorded.size, recorded.sha256):
        return False
    for name in (manifest_record.FILENAME, merge_record.FILENAME):
        entry, path = receipt.entry(name), artifact_dir / name
        if entry is None or not path.is_file() or path.stat().st_size != entry.size or sha256_file(path).sha256 != entry.sha256:
            return False
    for out in record.outputs:
        entry = receipt.entry(out.path)
        if entry is None or (entry.size, entry.sha256) != (out.size, out.sha256):
            return False
    others = [e for e in record.outputs if e.path != MODEL_NAME]
    return damaged_entry(artifact_dir, others, record="the record", rehash=True) is None


# What the commit's re-check compares: the files whose change means another writer was here.
WATCHED = (merge_record.FILENAME, manifest_record.FILENAME, MODEL_NAME, merge_progress.FILENAME, *PUBLISHED_MARKERS)


def directory_state(artifact_dir: Path) -> tuple[tuple[int, int, int] | None, ...]:
    """(inode, size, mtime) of each watched file, None where absent: every record is written by an atomic
    rename (a new inode), so a record another process committed meanwhile changes this state."""
    state: list[tuple[int, int, int] | None] = []
    for name in WATCHED:
        try:
            st = os.stat(artifact_dir / name, follow_symlinks=False)
        except OSError:
            state.append(None)
            continue
        state.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(state)


def _without_record(artifact_dir: Path, force: bool) -> Decision:
    manifest_path = manifest_record.path_in(artifact_dir)
    if manifest_path.exists() or manifest_path.is_symlink():
        producer = None
        try:
            manifest = manifest_record.read_manifest(manifest_path)
            producer = manifest.producer.tool if manifest.producer else None
        except InvalidRecord:
            producer = "an unreadable manifest"
        if producer != PRODUCER:
            if not force:
                raise Refused(
                    f"{artifact_dir} holds an artifact committed by {producer or 'an unnamed producer'} "
                    f"({manifest_record.FILENAME}) and no merge record",
                    remedy="merge into another iter_* directory, or rerun with --force to replace that artifact",
                )
            return Decision("build", f"forced: replaces an artifact committed by {producer or 'an unnamed producer'}")
        _refuse_unproven_model(artifact_dir, manifest)
        return Decision("build", "incomplete: an earlier merge stopped before its record")
    if (artifact_dir / MODEL_NAME).exists():
        _refuse_unproven_model(artifact_dir, None)
        return Decision("build", "incomplete: model.pt without a merge record")
    return Decision("build", "no previous output")


def _refuse_unproven_model(artifact_dir: Path, manifest: manifest_record.Manifest | None) -> None:
    """Refuse unless the record-less ``model.pt`` (if any) was written by merge: the in-progress
    marker names this very file, or merge's own manifest lists its size and digest."""
    model = artifact_dir / MODEL_NAME
    if not (model.exists() or model.is_symlink()):
        return
    marker = merge_progress.path_in(artifact_dir)
    if marker.exists():
        try:
            if merge_progress.read_merge_progress(marker).names(model):
                return
        except InvalidRecord:
            pass  # an unreadable marker proves nothing
    component = manifest.components.get("model") if manifest is not None else None
    if (component is not None and component.path == MODEL_NAME and model.is_file()
            and model.stat().st_size == getattr(component, "size", None)
            and sha256_file(model).sha256 == getattr(component, "sha256", None)):
        return
    raise Refused(
        f"{model} exists without a merge record, and neither an in-progress marker ({merge_progress.FILENAME}) "
        "nor a manifest written by merge proves that ckptflow merge wrote it; it may be the only copy of a model, "
        "so it is not replaced, not even with --force",
        remedy="move it out of the way if it does not belong here, or seal it (`ckptflow seal`) to keep it as "
        "this iteration's artifact and merge into another iter_* directory",
    )


def damaged_outputs(artifact_dir: Path, record: MergeRecord) -> str | None:
    """Why the recorded outputs are not intact (re-hashing each), or None when they are."""
    entries = {e.path: e for e in record.outputs}
    if MODEL_NAME not in entries:
        return f"the record does not list {MODEL_NAME}"
    problem = damaged_entry(artifact_dir, record.outputs, record="the record", rehash=True)
    if problem:
        return problem
    try:
        manifest = manifest_record.read_manifest(artifact_dir)
    except (InvalidRecord, NotFound) as exc:
        return f"the native manifest is missing or unreadable ({exc.message})"
    model = manifest.components.get("model")
    if model is None or model.path != MODEL_NAME or getattr(model, "sha256", None) != entries[MODEL_NAME].sha256:
        return "the native manifest does not name this model.pt"
    return None


def _diag_problem(record: MergeRecord, diag: Path | None, diag_rel: str | None) -> str | None:
    if diag is None:
        return None
    if diag_rel is not None:
        return None if record.diag == diag_rel else f"diagnostics were not recorded at {diag_rel}"
    # Outside the artifact directory the record cannot list it; its presence is all that can be checked.
    return None if os.path.isfile(diag) else f"diagnostics {diag} are missing"
