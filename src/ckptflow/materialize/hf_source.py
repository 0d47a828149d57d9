"""Where the teacher of a Hugging Face Trainer artifact comes from: which form the artifact is, the files the
teacher reads, where they are and their identity (``resolve``); ``hf_artifact`` builds the teacher.

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

A local artifact whose teacher files were pruned after publication is served by the archive its receipt
names.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..archive.copies import Unusable, first_serving, open_copy
from ..archive.keys import parse_artifact_uri
from ..conversion import shards as hf_shards
from ..conversion import sidecars as hf_sidecars
from ..digest import sha256_bytes
from ..errors import CkptflowError, NotFound, Refused, UsageError, VerificationFailed
from ..fsutil import resolve_inside
from ..jsonio import decode_json_object, encode_json
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from ..records.inventory import FileEntry
from ..records.materialized import BaseModelIdentity, SourceIdentity
from ..store.open import open_uri
from .source import MODEL_COMPONENT, ReceiptCopies

if TYPE_CHECKING:
    from ..store import StoreURI
    from ..store.base import ObjectStore

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
        return Resolved(local_source(Path(os.path.abspath(ckpt_dir)), credentials))
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


def local_source(artifact_dir: Path, credentials) -> TrainerSource | None:
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
