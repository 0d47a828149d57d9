"""A teacher from a Hugging Face Trainer artifact: a full fine-tune as it is, a LoRA run merged into its base.

The artifact of a Trainer's ``checkpoint-N`` (``trainer.hf.export_checkpoint``: one component per top-level
entry) has no ``model`` component: it is a Hugging Face directory already. ``resolve`` reads its manifest
(local, or one small GET of the archived one) and tells which form it is:

* **full**: ``config.json`` and safetensors weights (``model.safetensors``, or ``model.safetensors.index.json``
  and its ``model-*.safetensors`` shards). The teacher is the artifact's model files (``teacher_files``:
  weights, index, config, generation config, tokenizer and template files) copied as they are, without a
  conversion; the Trainer's state (``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state*.pth``,
  ``trainer_state.json``, ``training_args.bin``) and sub-directories are neither fetched nor copied. ``--base``
  is not used (the artifact is its own base: the identity's base is the artifact's config and index digests).
* **lora**: ``adapter_config.json`` and ``adapter_model.safetensors``. The teacher is the adapters merged into
  the base they were trained on: ``--base`` must be the model ``adapter_config.json``'s
  ``base_model_name_or_path`` names (the same directory, or a Hugging Face cache snapshot of that repository),
  else the request is refused by name, and so is an adapter type PEFT cannot merge. PEFT's own
  ``merge_and_unload`` merges them; the teacher holds the merged tensors under the base's names, the base's
  config.json and sidecars (tokenizer, templates), as a teacher built from a model.pt does.

The source identity is the sha256 of the sorted inventory (path, size, sha256 from the manifest) of the
files the teacher reads, its size their total bytes; the option ``trainer_artifact`` (``full`` or ``lora``)
is part of the identity. The marker (``.materialized``) lists every file of the teacher with its digest, so
the decision on <out> judges it by that inventory (``output.decide`` without a base directory).

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
import importlib.util
import logging
import os
import re
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import testhooks
from ..archive.copies import Unusable, first_serving, open_copy
from ..archive.keys import parse_artifact_uri
from ..conversion import CONVERSION_VERSION, chat_template
from ..conversion import shards as hf_shards
from ..conversion import sidecars as hf_sidecars
from ..digest import hash_files, sha256_bytes
from ..errors import CkptflowError, InvalidRecord, NotFound, Refused, UsageError, VerificationFailed
from ..fsutil import clone_file, fsync_dir, resolve_inside
from ..jsonio import decode_json_object, encode_json
from ..lock import reading
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from ..records.inventory import FileEntry
from ..records.materialized import BaseModelIdentity, Materialized, SourceIdentity, write_materialized
from ..store.open import open_uri
from . import preflight, recovery
from .identity import Identity, base_identity
from .lock import output_lock
from .output import decide, remove_dead_leftovers, restore_orphaned, staged_tree, swap_into_place
from .source import MODEL_COMPONENT, ReceiptCopies
from .staging import close_stage, open_stage

if TYPE_CHECKING:
    from ..store import StoreURI
    from ..store.base import ObjectStore
    from .run import MaterializeRequest, MaterializeResult

log = logging.getLogger("ckptflow.materialize")

OPTION = "trainer_artifact"  # identity option: "full" or "lora"
FULL, LORA = "full", "lora"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
MERGEABLE = frozenset({"LORA"})  # adapter types whose merge_and_unload gives one dense model
TRAINER_STATE = frozenset({"optimizer.pt", "optimizer.bin", "scheduler.pt", "scaler.pt", "trainer_state.json",
                           "training_args.bin"})
_RNG_STATE = re.compile(r"^rng_state(_[0-9]+)?\.pth$")
_SHARD = re.compile(r"^model-[0-9]{5}-of-[0-9]{5}\.safetensors$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class TrainerSource:
    """A Trainer artifact's files the teacher reads, and where they are."""

    kind: str  # "ckpt-dir" or "artifact-uri"
    form: str  # FULL or LORA
    location: str  # absolute artifact directory, or the artifact URI
    files: tuple[FileEntry, ...]  # the files the teacher reads, as the manifest records them
    components: frozenset[str]  # their manifest component names (what a fetch stages)
    identity: SourceIdentity
    config_sha256: str | None  # full: the artifact's config.json digest
    index_sha256: str | None  # full: the artifact's model.safetensors.index.json digest (None: one file)
    adapter_config: dict[str, Any] = field(default_factory=dict)  # lora: adapter_config.json
    uri: StoreURI | None = None
    store: ObjectStore | None = None
    artifact_name: str = ""
    copies: ReceiptCopies | None = None  # a pruned --ckpt-dir's: the receipt copy that serves, those skipped

    @property
    def model_path(self) -> str:
        if self.form == LORA:
            return ADAPTER_WEIGHTS
        paths = {e.path for e in self.files}
        return hf_shards.INDEX_NAME if hf_shards.INDEX_NAME in paths else hf_shards.SINGLE_NAME

    def base_identity(self) -> BaseModelIdentity:
        """A full artifact is its own base: its config and index digests."""
        assert self.form == FULL and self.config_sha256 is not None
        return BaseModelIdentity(self.location, self.config_sha256, self.index_sha256)

    def to_report(self) -> dict[str, Any]:
        return {"kind": self.kind, "location": self.location, "model_path": self.model_path, **self.identity.to_dict()}


# --------------------------------------------------------------------------------------------- resolve


def teacher_files(manifest: manifest_record.Manifest, where: str) -> tuple[str, dict[str, str]] | None:
    """The form of a Trainer artifact and its files the teacher reads (path -> component name); None for an
    artifact with a ``model`` component (a model.pt: the conversion's source). Refuses by name an artifact
    that holds no model at all, or weights that are not safetensors."""
    if MODEL_COMPONENT in manifest.components:
        return None
    files = {c.path: name for name, c in manifest.components.items()
             if isinstance(c, manifest_record.FileComponent) and "/" not in c.path}
    if ADAPTER_CONFIG in files and ADAPTER_WEIGHTS in files:
        return LORA, {p: files[p] for p in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)}
    if hf_sidecars.CONFIG_NAME in files and (hf_shards.SINGLE_NAME in files or hf_shards.INDEX_NAME in files):
        return FULL, {p: n for p, n in files.items() if _is_model_file(p)}
    found = ", ".join(sorted(manifest.components)) or "none"
    weights = [p for p in files if hf_shards.is_weight_file(p) and p not in TRAINER_STATE and not _RNG_STATE.match(p)]
    extra = (f"; its weight files ({', '.join(sorted(weights))}) are not safetensors" if weights else "")
    raise Refused(f"{where} holds no model to materialize: no 'model' component (a model.pt), no Hugging Face "
                  f"model ({hf_sidecars.CONFIG_NAME} with {hf_shards.SINGLE_NAME} or {hf_shards.INDEX_NAME}), no LoRA "
                  f"adapter ({ADAPTER_CONFIG} with {ADAPTER_WEIGHTS}){extra}; its components: {found}",
                  remedy="materialize an artifact a trainer or merge wrote with its model (a Trainer saving "
                  "safetensors, save_safetensors=True), or choose another iteration")


def _is_model_file(name: str) -> bool:
    if name.startswith(".") or name in TRAINER_STATE or _RNG_STATE.match(name):
        return False
    if name in (hf_shards.SINGLE_NAME, hf_shards.INDEX_NAME) or _SHARD.match(name):
        return True
    return not hf_shards.is_weight_file(name)  # config, generation config, tokenizer, templates, README


def source_sha256(manifest: manifest_record.Manifest) -> str | None:
    """The source digest a teacher built from this Trainer artifact records (``.materialized``'s ``source``);
    None for a model.pt artifact, one with no model, or one whose manifest records no digest for a file."""
    try:
        found = teacher_files(manifest, "the artifact")
        if found is None:
            return None
        return _identity(_entries(manifest, found[1], "the artifact"), None).sha256
    except Refused:
        return None


def trainer_files_present(artifact_dir: Path, manifest: manifest_record.Manifest) -> tuple[bool, str]:
    """Whether the files a teacher reads from the Trainer artifact ``artifact_dir`` are on disk with their
    recorded sizes (sizes only: the build verifies), and why; refuses an artifact with no model by name."""
    found = teacher_files(manifest, str(artifact_dir))
    assert found is not None  # the caller found no model component
    sizes = {c.path: c.size for c in manifest.components.values() if isinstance(c, manifest_record.FileComponent)}
    for rel in sorted(found[1]):
        path = artifact_dir / rel
        try:
            size = path.stat().st_size if path.is_file() else None
        except OSError:
            size = None
        if size != sizes[rel]:
            return False, f"{path} is {'missing' if size is None else f'{size} bytes, not {sizes[rel]}'}"
    return True, f"the {found[0]} Trainer model files of {artifact_dir} are present with their recorded sizes"


@dataclass(frozen=True)
class Resolved:
    """What ``resolve`` found: a Trainer artifact, or (``trainer`` None) what the model.pt path reuses: the
    archived manifest's bytes and the store they came from (so the manifest is read once)."""

    trainer: TrainerSource | None
    manifest_bytes: bytes | None = None
    store: ObjectStore | None = None


def resolve(*, ckpt_dir: Path | str | None, artifact_uri: str | None, store=None, credentials=None) -> Resolved:
    """The Trainer-artifact source of a request, or none when the artifact is a model.pt one (or the local
    directory is no committed artifact: the model.pt path names that)."""
    if ckpt_dir is not None:
        return Resolved(_local(Path(os.path.abspath(ckpt_dir)), credentials))
    assert artifact_uri is not None
    return _archived(artifact_uri, store, credentials)


def _entries(manifest: manifest_record.Manifest, chosen: dict[str, str], where: str) -> tuple[FileEntry, ...]:
    entries = []
    for path in sorted(chosen):
        c = manifest.components[chosen[path]]
        if c.sha256 is None:
            raise Refused(f"the manifest of {where} records no sha256 for {path}",
                          remedy="seal the artifact with digests (the Trainer callback does), or republish it")
        entries.append(FileEntry(path, c.size, c.sha256))
    return tuple(entries)


def _identity(entries: tuple[FileEntry, ...], uri: str | None) -> SourceIdentity:
    listing = [{"path": e.path, "sha256": e.sha256, "size": e.size} for e in entries]
    return SourceIdentity(uri, sha256_bytes(encode_json(listing)), sum(e.size for e in entries))


def _source(kind: str, form: str, location: str, manifest, chosen: dict[str, str], uri_text: str | None,
            **more) -> TrainerSource:
    entries = _entries(manifest, chosen, location)
    digests = {e.path: e.sha256 for e in entries}
    return TrainerSource(kind, form, location, entries, frozenset(chosen.values()), _identity(entries, uri_text),
                         digests.get(hf_sidecars.CONFIG_NAME), digests.get(hf_shards.INDEX_NAME), **more)


def _local(artifact_dir: Path, credentials) -> TrainerSource | None:
    try:
        manifest = manifest_record.read_manifest(artifact_dir)
    except NotFound:
        return None
    found = teacher_files(manifest, str(artifact_dir))
    if found is None:
        return None
    form, chosen = found
    missing = [p for p in chosen if not resolve_inside(artifact_dir, p, what="manifest path").is_file()]
    if missing:
        return _pruned(artifact_dir, missing, credentials)
    source = _source("ckpt-dir", form, str(artifact_dir), manifest, chosen, None, artifact_name=artifact_dir.name)
    for e in source.files:
        size = (artifact_dir / e.path).stat().st_size
        if size != e.size:
            raise VerificationFailed(f"{artifact_dir / e.path} has {size} bytes; its manifest records {e.size}",
                                     path=str(artifact_dir / e.path),
                                     remedy="the artifact is damaged or was rewritten after its manifest; restore it")
    if form == LORA:
        source = replace(source, adapter_config=_adapter_config((artifact_dir / ADAPTER_CONFIG).read_bytes(), source,
                                                                str(artifact_dir / ADAPTER_CONFIG)))
    return source


def _pruned(artifact_dir: Path, missing: list[str], credentials) -> TrainerSource:
    """The archive the receipt names serves a local artifact whose teacher files are gone (pruned): every
    destination it lists, in its order (``archive.copies.first_serving``, as a ``model.pt`` source's), the
    first that holds exactly the files the local manifest records."""
    try:
        receipt = receipt_record.read_receipt(artifact_dir)
    except NotFound:
        raise NotFound(f"{artifact_dir} is missing {', '.join(missing)} and has no receipt naming an archive",
                       path=str(artifact_dir), remedy="restore the payload, or materialize from the archive with "
                       "--artifact-uri") from None
    local = manifest_record.read_manifest(artifact_dir)
    found = teacher_files(local, str(artifact_dir))
    assert found is not None
    wanted = _entries(local, found[1], str(artifact_dir))
    receipt_path = receipt_record.path_in(artifact_dir)

    def attempt(dest) -> TrainerSource:
        store, uri = open_copy(dest, credentials, str(receipt_path))
        try:
            archived = _archived(str(uri), store, None).trainer
        except (CkptflowError, OSError) as exc:
            raise Unusable(exc) from exc
        if archived is None or archived.files != wanted:
            raise Unusable(VerificationFailed(
                f"{artifact_dir} is missing {', '.join(missing)} and the archive its receipt names ({uri}) does not "
                "hold the files its manifest records", path=str(artifact_dir),
                remedy="restore the payload, or materialize from the right archive with --artifact-uri"))
        return archived

    archived, dest, skipped = first_serving(receipt.destinations, attempt, lister=str(receipt_path),
                                            serves=f"the teacher files of {artifact_dir} ({', '.join(missing)} gone)")
    log.info("%s is missing %s (pruned); building from the archive its receipt names, %s", artifact_dir,
             ", ".join(missing), archived.location)
    return replace(archived, copies=ReceiptCopies(artifact_dir, dest, tuple(skipped), credentials))


def _archived(artifact_uri: str, store: ObjectStore | None, credentials) -> Resolved:
    artifact = parse_artifact_uri(artifact_uri, what="--artifact-uri")
    uri, name = artifact.uri, artifact.name
    store, prefix = open_uri(uri, store, credentials)

    def key(rel: str) -> str:
        return f"{prefix}/{rel}" if prefix else rel

    try:
        data = store.get_bytes(key(manifest_record.FILENAME))
    except NotFound:
        return Resolved(None, None, store)  # the model.pt path refuses it by name
    manifest = manifest_record.parse_manifest(data, what=f"{manifest_record.FILENAME} at {uri}")
    if manifest.iteration != artifact.iteration:
        return Resolved(None, data, store)  # idem
    found = teacher_files(manifest, str(uri))
    if found is None:
        return Resolved(None, data, store)
    form, chosen = found
    source = _source("artifact-uri", form, str(uri), manifest, chosen, str(uri), uri=uri, store=store,
                     artifact_name=name)
    if form == LORA:
        source = replace(source, adapter_config=_adapter_config(store.get_bytes(key(ADAPTER_CONFIG)), source,
                                                                f"{uri}/{ADAPTER_CONFIG}"))
    return Resolved(source)


def _adapter_config(data: bytes, source: TrainerSource, where: str) -> dict[str, Any]:
    recorded = next(e for e in source.files if e.path == ADAPTER_CONFIG)
    if (len(data), sha256_bytes(data)) != (recorded.size, recorded.sha256):
        raise VerificationFailed(f"{where} is not the {ADAPTER_CONFIG} the artifact's manifest records", path=where,
                                 remedy="the artifact is damaged or was rewritten after its manifest; restore it")
    return decode_json_object(data, what=where)


# --------------------------------------------------------------------------------------------- the base of an adapter


def check_adapter(source: TrainerSource, base_dir: Path | None) -> None:
    """Refuse by name an adapter PEFT cannot merge, or a ``--base`` that is not the model it was trained on."""
    config, where = source.adapter_config, f"{source.location}/{ADAPTER_CONFIG}"
    kind = config.get("peft_type")
    named = config.get("base_model_name_or_path")
    if importlib.util.find_spec("peft") is None:
        raise Refused(f"merging the LoRA adapter {source.location} needs PEFT, which is not installed",
                      remedy="install peft (the hf-test extra pins it: pip install 'ckptflow[hf-test]'), then rerun")
    if kind not in MERGEABLE:
        raise Refused(f"{where} is a {kind} adapter: PEFT's merge_and_unload cannot merge it into its base's weights",
                      path=where, remedy="load the adapter on its base with PEFT at inference instead of a merged teacher")
    if config.get("modules_to_save"):
        raise Refused(f"{where} trains whole modules besides the LoRA layers (modules_to_save: "
                      f"{config['modules_to_save']}); this tool merges LoRA layers only", path=where,
                      remedy="merge it with PEFT yourself and materialize that model")
    if base_dir is None:
        raise UsageError(f"--base is required for the LoRA adapter {source.location}: the teacher is the adapter "
                         f"merged into the base it was trained on ({named!r})",
                         remedy=f"pass --base the directory of {named!r}")
    if not isinstance(named, str) or not named:
        raise Refused(f"{where} names no base_model_name_or_path: the base it was trained on is unknown", path=where,
                      remedy="record the base in adapter_config.json (PEFT writes it), then rerun")
    if not same_base(named, base_dir):
        raise Refused(f"the LoRA adapter {source.location} was trained on {named!r} ({ADAPTER_CONFIG}'s "
                      f"base_model_name_or_path), not on --base {base_dir}; merged into another base it is another "
                      "model", path=where, remedy=f"pass --base the directory of {named!r} (that directory, or a "
                      "Hugging Face cache snapshot of that repository)")


def same_base(named: str, base_dir: Path) -> bool:
    """``base_model_name_or_path`` names ``base_dir``: the same directory, or a hub id whose cache snapshot it is."""
    with contextlib.suppress(OSError):
        if os.path.isdir(named) and os.path.samefile(named, base_dir):
            return True
    if _HUB_ID.match(named):
        parts = Path(os.path.realpath(base_dir)).parts
        cache = "models--" + named.replace("/", "--")
        return any(p == cache and i + 2 < len(parts) and parts[i + 1] == "snapshots" for i, p in enumerate(parts))
    return False


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
            again = _local(Path(source.location), credentials)  # a prune may have run while this waited
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
