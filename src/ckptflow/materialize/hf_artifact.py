"""A teacher from a Hugging Face Trainer artifact: a full fine-tune as it is, a LoRA run merged into its base.

Which form an artifact is, the files its teacher reads and their identity are ``hf_source``'s
(``resolve``, ``TrainerSource``); this module builds the teacher from them.

Everything else is ``materialize``'s: under the output's lock (a local artifact marked as read in place)
the decision, the free-space check, the fetch into the stage (archived sources only, only when a build is
needed, only the components the teacher reads, each file verified against its digest), the staged build,
the verification, the marker and the swap. The verification of a full teacher: every copied file hashes to
the artifact's digest (under ``--unified-chat-template`` the two rewritten template files to the unified
bytes), the safetensors index and headers are well-formed with the tensor floor / count, the transformers
loaders load tokenizer and generation config, and (unless ``--no-verify``) ``AutoModelForCausalLM`` loads
the teacher with every tensor equal to the artifact's. Of a LoRA teacher: the same loaders, and the model
transformers loads from the teacher has exactly the tensors of PEFT's ``merge_and_unload`` of the adapter
(bitwise), always (the merge is the build).

A local artifact whose teacher files were pruned after publication is served by the archive its receipt
names. Recovery of a killed build's staged tree is not attempted for these sources: the teacher is built
again, and the killed run's tree removed as ``output.remove_dead_leftovers`` says (one with a marker once
<out> is complete).

"""

from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from .. import testhooks
from ..conversion import CONVERSION_VERSION, chat_template
from ..conversion import shards as hf_shards
from ..conversion import sidecars as hf_sidecars
from ..digest import hash_files, sha256_bytes
from ..errors import InvalidRecord, Refused, VerificationFailed
from ..fsutil import clone_file, fsync_dir
from ..lock import reading
from ..records.inventory import FileEntry
from ..records.materialized import Materialized, write_materialized
from . import preflight, recovery
from .hf_source import FULL, LORA, OPTION, TrainerSource, check_adapter, local_source
from .identity import Identity, base_identity
from .lock import output_lock
from .output import decide, remove_dead_leftovers, restore_orphaned, staged_tree, swap_into_place
from .staging import close_stage, open_stage

if TYPE_CHECKING:
    from .run import MaterializeRequest, MaterializeResult

log = logging.getLogger("ckptflow.materialize")


# --------------------------------------------------------------------------------------------- materialize


def materialize_trainer(req: MaterializeRequest, source: TrainerSource, wait: float, credentials) -> MaterializeResult:
    """``materialize`` for a Trainer artifact (see the module doc); ``req.base_dir`` None for a full one."""
    from .run import MaterializeResult

    if source.form == LORA:
        check_adapter(source, req.base_dir)
    elif req.base_dir is not None:
        log.info("%s is a complete Hugging Face model: --base %s is not used", source.location, req.base_dir)
    out = req.out
    with output_lock(out, wait), contextlib.ExitStack() as held:
        if source.kind == "ckpt-dir":  # a prune keeps what a reader marks
            held.enter_context(reading(Path(source.location)))
            again = local_source(Path(source.location), credentials)  # a prune may have run while this waited
            assert again is not None
            source = again
        if source.kind == "artifact-uri" and req.stage_root is None:  # --ckpt-dir, served by its archive
            req = replace(req, stage_root=out.with_name(out.name + ".stage"))
        base, unified = None, None
        if source.form == LORA:
            assert req.base_dir is not None
            base = preflight.check_base(req.base_dir, expect_tensors=req.expect_tensors, min_tensors=req.min_tensors)
            base_id = base_identity(req.base_dir)
            unified = preflight.check_unified(req.base_dir) if req.unified else None
        else:
            base_id = source.base_identity()
            if req.unified and source.kind == "ckpt-dir":  # an archived one: once its templates are fetched
                unified = preflight.check_unified(Path(source.location))
        options = {**req.options(), OPTION: source.form}
        if source.form == FULL:
            options.pop("max_shard_bytes", None)  # the weights are copied as they are
        wanted = Identity(CONVERSION_VERSION, source.identity, base_id, options)
        restored = restore_orphaned(out)
        decision = decide(out, wanted, None, force=req.force)
        if decision.action == "skip":
            return MaterializeResult(status="skipped", reason=decision.reason, out=out, source=source,  # type: ignore[arg-type]
                                     identity=wanted, record=decision.previous, restored=restored)
        need = (preflight.export_bytes(base) if base is not None else sum(e.size for e in source.files) + (1 << 20))
        _check_space(out, need)
        recovery.refuse_leftover_previous(out, force=req.force)
        removed = remove_dead_leftovers(out, None, previous=False)
        stage, stage_report, fetched = None, None, None
        try:
            if source.kind == "artifact-uri":
                assert req.stage_root is not None
                stage = open_stage(req.stage_root, source.artifact_name, keep=req.keep_staged)
                src_dir, fetched = _fetch(source, stage, req.progress, need)
            else:
                src_dir = Path(source.location)
            build = _build_full if source.form == FULL else _build_lora
            if req.unified and unified is None:
                unified = preflight.check_unified(src_dir)
            taken, record, summary = build(req, source, src_dir, wanted, decision, unified)
        finally:
            if stage is not None:
                stage_report = stage.report(kept=close_stage(stage))
    if taken is not None:
        return MaterializeResult(status="skipped", reason="a concurrent request published the same identity first",
                                 out=out, source=source, identity=wanted, record=taken, fetch=fetched,  # type: ignore[arg-type]
                                 staging=stage_report, restored=restored, removed_leftovers=removed)
    return MaterializeResult(
        status="built", reason=decision.reason, out=out, source=source, identity=wanted, record=record,  # type: ignore[arg-type]
        verification=summary, replaced=Identity.of(decision.previous) if decision.previous is not None else None,
        fetch=fetched, staging=stage_report, restored=restored,
        removed_leftovers=removed + remove_dead_leftovers(out, None, previous=True))


def _check_space(out: Path, need: int) -> None:
    free = preflight.free_bytes(out.parent)
    if free < need:
        raise preflight.refused(f"{out.parent} has {free} bytes free, the staged teacher needs {need}",
                                "the staged build writes a second teacher beside the existing output until the swap "
                                "and would have run out of space", path=out.parent,
                                remedy="free space (two teachers side by side), or choose another --out")


def _fetch(source: TrainerSource, stage, progress, need: int) -> tuple[Path, dict]:
    """Fetch the components the teacher reads into the stage, each file verified against its digest."""
    from ..archive.fetch import fetch_artifact

    result = fetch_artifact(source.uri, stage.root, store=source.store, progress=progress, reserve=need,
                            reserve_for="the staged teacher beside --out", components=source.components)
    testhooks.reached("materialize:after-fetch")
    verified = {e.path: (e.size, e.sha256) for e in result.plan.payloads}
    for e in source.files:
        if verified.get(e.path) != (e.size, e.sha256):
            raise VerificationFailed(f"the staged {e.path} in {result.path} was verified against another digest than "
                                     f"the manifest read at {source.location} records", path=str(result.path / e.path),
                                     remedy="rerun the command; an archived manifest is immutable, so check the archive")
    return result.path, {"status": result.status, "path": str(result.path), "downloaded": result.downloaded,
                         "downloaded_bytes": result.downloaded_bytes}


def _finish(req: MaterializeRequest, tmp: Path, wanted: Identity, decision, tensor_count: int,
            unified: chat_template.Unified | None) -> tuple[Materialized, Materialized | None]:
    """Hash every file of the staged teacher into its marker, write it, swap into place."""
    files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    digests = hash_files(tmp, files, progress=req.progress, desc="materialize sha256")
    record = Materialized(conversion_version=wanted.conversion_version, source=wanted.source, base=wanted.base,
                          options=wanted.options, shards=tuple(FileEntry(p, d.size, d.sha256) for p, d in digests.items()),
                          tensor_count=tensor_count, chat_template=unified.record() if unified is not None else None)
    write_materialized(tmp, record)
    fsync_dir(tmp)
    testhooks.reached("materialize:after-marker")
    testhooks.reached("materialize:before-swap")
    taken = swap_into_place(tmp, req.out, wanted, replace=decision.replace, base_dir=None)
    return record, taken


def _check_weights(req: MaterializeRequest, tmp: Path) -> hf_shards.Index:
    from ..conversion.verify import check_tensor_count

    try:
        index = hf_shards.read_index(tmp, what="teacher")
        hf_shards.read_headers(tmp, index)
    except InvalidRecord as exc:
        raise VerificationFailed(f"the staged teacher's weights: {exc.message}", path=str(tmp),
                                 remedy="the artifact's safetensors are not loadable; check the artifact") from None
    check_tensor_count(tmp, index, min_tensors=req.min_tensors, expect_tensors=req.expect_tensors)
    return index


def _summary(index: hf_shards.Index, tmp: Path, checks: list[str], verified: bool, sidecars: tuple[str, ...]):
    from ..conversion import VerificationSummary
    from ..conversion.verify import check_loaders

    shards = sorted(set(index.weight_map.values()))
    summary = VerificationSummary(tensor_count=len(index.weight_map), shard_count=len(shards),
                                  total_size=sum((tmp / s).stat().st_size for s in shards), checks=tuple(checks),
                                  sidecars=sidecars, tensors_verified=verified)
    return check_loaders(tmp, summary)


def _build_full(req: MaterializeRequest, source: TrainerSource, src_dir: Path, wanted: Identity, decision,
                unified: chat_template.Unified | None):
    with staged_tree(req.out) as tmp:
        for e in source.files:
            clone_file(src_dir / e.path, tmp / e.path)
        fsync_dir(tmp)
        testhooks.reached("materialize:after-convert")
        if unified is not None:
            chat_template.write_unified(tmp, unified)
        expected = {e.path: e.sha256 for e in source.files}
        if unified is not None:
            expected.update({rel: sha256_bytes(data) for rel, data in unified.expected().items()})
        got = hash_files(tmp, sorted(expected), progress=req.progress, desc="teacher sha256")
        wrong = [p for p, d in got.items() if d.sha256 != expected[p]]
        if wrong:
            raise VerificationFailed(f"the staged teacher's {', '.join(wrong)} differ from the artifact {source.location}",
                                     path=str(tmp), remedy="rerun; if it persists, the artifact's files changed: restore it")
        index = _check_weights(req, tmp)
        checks = ["file_digests", "tensor_count", "index_headers"] + (["unified_chat_template"] if unified else [])
        if req.verify_tensors:
            _compare_loaded(tmp, lambda: _safetensors(src_dir, index), what=f"the artifact {source.location}")
            checks.append("tensors_equal_artifact")
        sidecars = tuple(sorted(e.path for e in source.files if not hf_shards.is_weight_file(e.path)))
        summary = _summary(index, tmp, checks, req.verify_tensors, sidecars)
        record, taken = _finish(req, tmp, wanted, decision, len(index.weight_map), unified)
    return taken, record, summary


def _build_lora(req: MaterializeRequest, source: TrainerSource, src_dir: Path, wanted: Identity, decision,
                unified: chat_template.Unified | None):
    assert req.base_dir is not None
    merged = merge_adapter(req.base_dir, src_dir, where=source.location)
    base_index = hf_shards.read_index(req.base_dir, what="base")
    missing = sorted(k for k in base_index.weight_map if k not in merged)
    if missing:
        raise VerificationFailed(f"PEFT's merge of {source.location} into {req.base_dir} has no tensor "
                                 f"{', '.join(missing[:5])} of the base", path=str(req.base_dir),
                                 remedy="check that --base is the model the adapter was trained on")
    with staged_tree(req.out) as tmp:
        sidecars = hf_sidecars.list_sidecars(req.base_dir).files
        hf_sidecars.copy_sidecars(req.base_dir, tmp, sidecars)
        _write_weights(tmp, {k: merged[k] for k in base_index.weight_map}, req.max_shard_bytes)
        testhooks.reached("materialize:after-convert")
        if unified is not None:
            chat_template.write_unified(tmp, unified)
        index = _check_weights(req, tmp)
        _compare_loaded(tmp, lambda: merged, what=f"PEFT's merge_and_unload of {source.location} into {req.base_dir}",
                        every=True)
        checks = ["tensor_count", "index_headers", "merged_tensors_equal_peft"]
        summary = _summary(index, tmp, checks + (["unified_chat_template"] if unified else []), True, sidecars)
        record, taken = _finish(req, tmp, wanted, decision, len(index.weight_map), unified)
    return taken, record, summary


def merge_adapter(base_dir: Path, adapter_dir: Path, *, where: str) -> dict:
    """PEFT's ``merge_and_unload`` of the adapter in ``adapter_dir`` on the base: its state dict (CPU)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    try:
        with _no_bars(), warnings.catch_warnings():  # PEFT 0.21 still calls the deprecated is_gradient_checkpointing
            warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
            model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype="auto", device_map="cpu")
            merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    except Exception as exc:  # noqa: BLE001 - transformers and PEFT raise many types; name the adapter and why
        raise Refused(f"PEFT cannot merge the adapter {where} into {base_dir}: {type(exc).__name__}: {exc}",
                      path=str(base_dir), remedy="pass --base the model the adapter was trained on") from None
    with torch.no_grad():
        return {k: v.detach().contiguous() for k, v in merged.state_dict().items()}


def _write_weights(tmp: Path, tensors: dict, max_shard_bytes: int) -> None:
    """The merged tensors as safetensors: one ``model.safetensors``, or shards and their index."""
    from safetensors.torch import save_file

    sizes = [(k, t.numel() * t.element_size()) for k, t in tensors.items()]
    groups = hf_shards.plan_shards(sizes, max_shard_bytes)
    if len(groups) == 1:
        save_file(tensors, str(tmp / hf_shards.SINGLE_NAME), metadata={"format": "pt"})
        return
    weight_map = {}
    for k, group in enumerate(groups, 1):
        name = hf_shards.shard_name(k, len(groups))
        save_file({key: tensors[key] for key in group}, str(tmp / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(group, name))
    hf_shards.write_index(tmp, weight_map, sum(s for _, s in sizes))


def _safetensors(directory: Path, index: hf_shards.Index) -> dict:
    from safetensors.torch import load_file

    out: dict = {}
    for shard in sorted(set(index.weight_map.values())):
        out.update(load_file(str(directory / shard)))
    return out


def _compare_loaded(tmp: Path, expected, *, what: str, every: bool = False) -> None:
    """transformers loads the staged teacher, and each tensor ``expected()`` holds is bitwise its tensor
    (``every``: the two hold the same names)."""
    from transformers import AutoModelForCausalLM

    from ..conversion.layout import bitwise_equal

    try:
        with _no_bars():
            model = AutoModelForCausalLM.from_pretrained(str(tmp), dtype="auto", device_map="cpu")
    except Exception as exc:  # noqa: BLE001 - transformers raises many types; name the teacher and why
        raise VerificationFailed(f"transformers cannot load the staged teacher {tmp}: {type(exc).__name__}: {exc}",
                                 path=str(tmp), remedy="check the artifact's config and weights") from None
    loaded = model.state_dict()
    want = expected()
    names = set(want) ^ set(loaded) if every else set(want) - set(loaded)
    if names:
        raise VerificationFailed(f"the teacher transformers loads and {what} differ in their tensor names: "
                                 f"{', '.join(sorted(names)[:5])}", path=str(tmp), remedy="rebuild the teacher")
    for key in sorted(want):
        a, b = loaded[key], want[key]
        if a.dtype != b.dtype or a.shape != b.shape or not bitwise_equal(a, b):
            raise VerificationFailed(f"tensor {key} of the teacher transformers loads from {tmp} differs from {what}",
                                     path=str(tmp), remedy="rebuild the teacher; if it persists, report the model type")


@contextlib.contextmanager
def _no_bars():
    """transformers' progress bars ("Loading weights") off inside the block: the report says what was loaded."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
