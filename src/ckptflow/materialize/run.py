"""``materialize()``: the request, and the decision taken under the output's lock (the steps it runs: ``build.py``).

Order of work (each step only after the previous one succeeded; nothing is written before step 6, except
that step 4 renames back an output a killed swap left aside)::

    0. Trainer artifact  a manifest without a ``model`` component is a Hugging Face Trainer artifact (a full
                         fine-tune, or a LoRA adapter): ``hf_artifact`` builds its teacher (no conversion, the
                         same lock, decision, fetch, staged build and swap); what follows is for a model.pt
    1. source identity   --ckpt-dir: the local native manifest's ``model`` file component (size, sha256);
                         --artifact-uri: the remote native manifest alone (one small GET), no payload
    2. lock              ``<out>.lock`` (``lock.py``), waited for up to --lock-wait-seconds; held to the end;
                         --ckpt-dir: a reader mark beside the artifact (``ckptflow.lock.reading``) from
                         here to the end, so a prune keeps the files this request reads;
                         a local source is resolved again under it: a model.pt pruned meanwhile is read
                         from the archive its receipt names (``source.resolve_under_lock``)
    3. bind the source   --ckpt-dir: model.pt opened ONCE (``source.OpenedModel``); a manifest without a
                         digest -> the identity is hashed from that descriptor
    4. preflight         the base is read and validated, the tensor floor / count checked
                         (``preflight.py``: one refusal family), before any leftover is restored or removed
                         and before torch is imported (the conversion is imported after it)
    5. base identity     sha256 of config.json and of the weight index (or of a lone shard's header);
       decision          on <out> (see below); a crash-orphaned previous tree is renamed back first;
                         a build: free space for the staged export beside the existing one
    6. payload           archive: ``archive.fetch.fetch_artifact`` (``build.fetch_model``) of the ``model``
                         component alone (all the conversion reads: optimizer state stays in the archive)
                         into the stage
                         (``staging.py``: the named <stage-dir>/iter_N when kept or already there, else
                         a private one), every byte hashed by this fetch (downloaded, or re-hashed in an existing copy) against
                         the source identity, then opened once and hashed again from that descriptor (a
                         copy changed after the fetch is refused); local: the opened model.pt hashed from
                         its descriptor against the manifest
    7. staged build      convert into <out>.tmp.<host>.<pid>.<token> beside <out> (--unified-chat-template:
                         then the two template files rewritten, step "sidecars") and verify_output, both
                         reading the opened file (``/proc/self/fd/N``: a path replaced meanwhile is never
                         read), then the transformers loaders on the staged tree (``check_loaders``); an
                         in-place change of it (size/mtime) refuses; hash the shards, write
                         ``.materialized`` inside the staged tree (commit record)
    8. swap into place   <out> absent or empty: rename; otherwise swap: <out> -> <out>.previous.<...>
                         (a file no build writes found there puts it back and refuses), staged tree ->
                         <out>, then of the previous tree only what a build wrote is removed (marker first)
    9. cleanup           a private stage (``staging.close_stage``): only this tool's files in it, then the
                         directories this invocation created while they are empty (never a named or kept stage)

Decision on <out> (identity = conversion version + source sha256/size + base config/index sha256 +
identity options; the source URI and the base path are recorded but are not identity):

* absent or an empty directory -> build;
* ``.materialized`` of the same identity, intact -> **skipped**. Intact means: the marker parses, every
  shard it lists is a regular file of the recorded size, the index names exactly those shards and the
  marker's tensor count, and config.json and every sidecar are byte-identical to the base's. Shards are
  *not* re-hashed on skip: that would read the whole model (tens of GB) on every workflow run; the full
  check (``verify_output``, shard digests) runs on every build: rebuild with ``force`` or use a fresh <out>;
* same identity but not intact (a shard missing or resized, a sidecar changed) -> rebuilt (swap);
* another identity, another conversion version, an older marker protocol or an unreadable marker ->
  **refused** naming both identities, unless ``force`` (then rebuilt, swap);
* ``force`` and the same identity -> rebuilt (how an output built with --no-verify gets verified);
* anything else (a non-empty directory without our marker, a file, a symlink) is foreign -> refused,
  with or without ``force``: this tool never deletes bytes it did not write.

A rebuild (with or without ``force``) removes from <out> only what a build writes there: the marker,
config.json, the index, the shards (``model-NNNNN-of-NNNNN.safetensors`` and those the marker lists) and
the base's sidecars. Any other entry (``eval/results.json``, ``NOTES.md``) refuses the request by name
before anything is fetched, and again at the swap, once the old tree is aside.

A refusal writes nothing: <out> stays byte-identical. A failure before the swap removes only the staged
tree; <out> stays byte-identical. The lock serialises requests for one <out> (two identical ones: one
builds, the other waits and skips; a differing one is refused on the marker), but ``flock`` is not
trusted (Lustre/GPFS/NFS may ignore it): correctness comes from the unique staged names and renames.
Two requests that both get past the lock both build; the second rename finds <out> taken and re-decides
(same identity -> skipped, else refused). Leftovers of killed runs (this host, dead pid) follow
``recovery.py``: an orphaned previous tree (<out> absent) is renamed back before any decision; a skip
deletes nothing; a build is refused beside another leftover previous tree unless ``force``; a complete
staged tree that is the only complete one is recovered (same identity, no ``force``) or kept until
<out> is complete again; other staged trees are removed by the next run that builds.

Test points (``testhooks``): ``materialize:lock-wait`` (the lock is held by another; reached once),
``materialize:after-open`` (model.pt opened, under the lock), ``materialize:after-fetch``, ``materialize:after-convert``,
``materialize:after-marker``, ``materialize:before-swap``, ``materialize:mid-swap`` (old output aside,
new one not yet in), ``materialize:after-swap`` (before the old tree is removed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__, testhooks
from ..conversion import CONVERSION_VERSION, DEFAULT_MIN_TENSORS, chat_template
from ..conversion import shards as hf_shards
from ..errors import UsageError
from ..lock import reading
from ..records.materialized import Materialized
from . import hf_artifact, hf_source, preflight, recovery
from .build import Built, build, fetch_model, recover
from .identity import Identity, base_identity
from .lock import DEFAULT_WAIT_SECONDS, check_wait_seconds, output_lock
from .output import decide, remove_dead_leftovers, restore_orphaned
from .source import ModelSource, OpenedModel, resolve_source, resolve_under_lock
from .staging import Stage, close_stage, open_stage

if TYPE_CHECKING:
    from ..conversion import VerificationSummary

log = logging.getLogger("ckptflow.materialize")

STATUSES = ("built", "skipped")


@dataclass
class MaterializeResult:
    status: str  # one of STATUSES
    reason: str
    out: Path
    source: ModelSource
    identity: Identity
    record: Materialized
    verification: VerificationSummary | None = None
    replaced: Identity | None = None
    fetch: dict | None = None
    staging: dict | None = None
    restored: str | None = None
    removed_leftovers: list[str] = field(default_factory=list)
    recovered: str | None = None

    def to_report(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "reason": self.reason,
            "out": str(self.out),
            "source": self.source.to_report(),
            "base": self.identity.base.to_dict(),
            "conversion_version": self.identity.conversion_version,
            "options": dict(self.identity.options),
            "tensor_count": self.record.tensor_count,
            "shards": [e.to_dict() for e in self.record.shards],
            "verification": self.verification.to_dict() if self.verification is not None else None,
            "replaced_identity": self.replaced.to_dict() if self.replaced is not None else None,
            "fetch": self.fetch,
            "staging": self.staging,
            "restored": self.restored,
            "removed_leftovers": self.removed_leftovers,
            "recovered": self.recovered,
            **({"skipped_destinations": [s.to_dict() for s in self.source.copies.skipped]}
               if self.source.copies is not None and self.source.copies.skipped else {}),
            "chat_template": dict(self.record.chat_template) if self.record.chat_template is not None else None,
            "tool_version": __version__,
        }


@dataclass(frozen=True)
class MaterializeRequest:
    base_dir: Path | None  # None: a full Trainer artifact, its own base (``hf_artifact``)
    out: Path
    stage_root: Path  # the named stage root (--stage-dir, default <out>.stage), for an archived source
    expect_tensors: int
    min_tensors: int
    verify_tensors: bool
    force: bool
    keep_staged: bool
    max_shard_bytes: int
    progress: bool | None
    unified: bool = False

    def options(self) -> dict[str, Any]:
        """The identity options (the unified template only when on: outputs built without it keep theirs)."""
        return {"max_shard_bytes": self.max_shard_bytes, **({chat_template.OPTION: True} if self.unified else {})}


def materialize(
    *,
    base: Path | str | None,
    out: Path | str,
    ckpt_dir: Path | str | None = None,
    artifact_uri: str | None = None,
    expect_tensors: int = 0,
    min_tensors: int = DEFAULT_MIN_TENSORS,
    verify_tensors: bool = True,
    force: bool = False,
    stage_dir: Path | str | None = None,
    keep_staged: bool = False,
    max_shard_bytes: int = hf_shards.DEFAULT_MAX_SHARD_BYTES,
    lock_wait_seconds: float = DEFAULT_WAIT_SECONDS,
    unified_chat_template: bool = False,
    store=None,
    credentials=None,
    progress: bool | None = None,
) -> MaterializeResult:
    """Build (or reuse) the HF directory ``out`` for one artifact's model.pt and ``base``; see the module doc.

    Exactly one of ``ckpt_dir`` and ``artifact_uri``. ``store`` (optional) is an open store of the URI's
    bucket; otherwise one is opened with ``credentials`` (a ``Credentials`` or None; unused for file://).
    ``verify_tensors=False`` (--no-verify) skips only the bitwise tensor probes of ``verify_output``.
    ``unified_chat_template`` (--unified-chat-template): see ``conversion.chat_template``; part of the identity.
    """
    base_dir = Path(os.path.abspath(base)) if base is not None else None
    out = Path(os.path.abspath(out))
    stage_root = _check_arguments(base_dir, out, ckpt_dir, artifact_uri, expect_tensors, min_tensors, stage_dir,
                                  keep_staged, max_shard_bytes)
    wait = check_wait_seconds(lock_wait_seconds)
    request = MaterializeRequest(base_dir, out, stage_root, expect_tensors, min_tensors, verify_tensors, force,
                                 keep_staged, max_shard_bytes, progress, bool(unified_chat_template))
    found = hf_source.resolve(ckpt_dir=ckpt_dir, artifact_uri=artifact_uri, store=store, credentials=credentials)
    if found.trainer is not None:  # a Hugging Face Trainer artifact: its own build, no conversion
        return hf_artifact.materialize_trainer(request, found.trainer, wait, credentials)
    if base_dir is None:
        raise UsageError(f"--base is required to materialize {ckpt_dir or artifact_uri}: its model.pt is converted "
                         "onto the base's layout", remedy="pass --base the Hugging Face base directory")
    source = resolve_source(ckpt_dir=ckpt_dir, artifact_uri=artifact_uri, store=found.store or store,
                            credentials=credentials, manifest_bytes=found.manifest_bytes)
    with output_lock(out, wait), contextlib.ExitStack() as held:
        opened = None
        if source.kind == "ckpt-dir":  # before the source is judged: a prune keeps what a reader marks
            held.enter_context(reading(Path(source.location)))
        resolved = resolve_under_lock(source, credentials)  # a prune may have run while this waited
        if resolved.kind != source.kind:
            log.info("%s was removed while this request waited for %s; building from the archive its receipt "
                     "names, %s", source.local_path, out.name + ".lock", resolved.location)
        source = resolved
        if source.kind == "ckpt-dir":  # opened once, under the lock: every later read goes through it
            source, opened = held.enter_context(source.open_local(progress=progress))
            testhooks.reached("materialize:after-open")
        return _locked(request, source, opened, held)


def _locked(req: MaterializeRequest, source: ModelSource, opened: OpenedModel | None,
            held: contextlib.ExitStack) -> MaterializeResult:
    """Restore, decide, build and swap: all of it under the output's lock."""
    out, base_dir = req.out, req.base_dir
    base = preflight.check_base(base_dir, expect_tensors=req.expect_tensors, min_tensors=req.min_tensors)
    unified = preflight.check_unified(base_dir) if req.unified else None
    wanted = Identity(CONVERSION_VERSION, source.identity, base_identity(base_dir), req.options())
    restored = restore_orphaned(out)
    decision = decide(out, wanted, base_dir, force=req.force)
    if decision.action == "skip":  # a killed run's leftovers stay as they are: a skip deletes nothing
        return MaterializeResult(status="skipped", reason=decision.reason, out=out, source=source, identity=wanted,
                                 record=decision.previous, restored=restored)

    preflight.check_space(out, base)
    recovery.refuse_leftover_previous(out, force=req.force)
    dead_tree = None if req.force or decision.replace else recovery.recoverable(out, wanted)
    removed = remove_dead_leftovers(out, base_dir, previous=False)
    stage: Stage | None = None
    stage_report: dict | None = None
    fetched: dict | None = None
    try:
        if opened is None:
            assert req.stage_root is not None
            stage = open_stage(req.stage_root, source.artifact_name, keep=req.keep_staged)
            reserve = 0 if dead_tree is not None else preflight.export_after_fetch(stage.root, out, base)
            model_pt, fetched, source = fetch_model(source, stage, req.progress, reserve)
            wanted = dataclasses.replace(wanted, source=source.identity)  # the copy that served (not identity)
            opened = OpenedModel.open(model_pt)  # converted and verified through this descriptor
            held.callback(opened.close)
        # The digest of record is taken from the opened descriptor (fetch verified the staged copy by path).
        source.check_digest(opened, progress=req.progress)
        built: Built | None = None
        if dead_tree is not None:
            built = recover(req, dead_tree, opened, wanted, decision, unified)
        if built is None:
            built = build(req, opened, wanted, decision, unified)
    finally:
        if stage is not None:
            stage_report = stage.report(kept=close_stage(stage))
    if built.status == "skipped":  # a concurrent request published the same identity first
        return MaterializeResult(status="skipped", reason=built.reason, out=out, source=source, identity=wanted,
                                 record=built.record, fetch=fetched, staging=stage_report, restored=restored,
                                 removed_leftovers=removed)
    return MaterializeResult(
        status=built.status, reason=built.reason, out=out, source=source, identity=wanted, record=built.record,
        verification=built.verification,
        replaced=Identity.of(decision.previous) if decision.previous is not None else None,
        fetch=fetched, staging=stage_report, restored=restored,
        removed_leftovers=removed + remove_dead_leftovers(out, base_dir, previous=True),
        recovered=str(built.recovered_from) if built.recovered_from is not None else None,
    )


def _check_arguments(base_dir, out, ckpt_dir, artifact_uri, expect_tensors, min_tensors, stage_dir, keep_staged,
                     max_shard_bytes) -> Path:
    """Usage errors, before anything is read; returns the named stage root."""
    if (ckpt_dir is None) == (artifact_uri is None):
        raise UsageError("pass exactly one of --ckpt-dir and --artifact-uri")
    for name, value in (("--expect-tensors", expect_tensors), ("--min-tensors", min_tensors)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UsageError(f"{name} must be an integer >= 0, got {value!r}")
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes <= 0:
        raise UsageError(f"--max-shard-size must be a positive number of bytes, got {max_shard_bytes!r}")
    if out == Path(out.anchor):
        raise UsageError("--out is the file-system root", remedy="name a directory for the teacher")
    if base_dir is not None and _overlaps(out, base_dir):
        raise UsageError(f"--out {out} and --base {base_dir} overlap", remedy="write the teacher outside the base")
    if ckpt_dir is not None and _overlaps(out, Path(os.path.abspath(ckpt_dir))):
        raise UsageError(f"--out {out} and --ckpt-dir {ckpt_dir} overlap", remedy="write the teacher elsewhere")
    # A --ckpt-dir whose model.pt was pruned is read from an archive its receipt lists, through this stage too.
    stage_root = Path(os.path.abspath(stage_dir)) if stage_dir is not None else out.with_name(out.name + ".stage")
    if _overlaps(out, stage_root) or (base_dir is not None and _overlaps(base_dir, stage_root)):
        raise UsageError(f"--stage-dir {stage_root} overlaps --out or --base",
                         remedy="stage beside the output, not in it")
    return stage_root


def _overlaps(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)
