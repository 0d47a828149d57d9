"""Tensor layouts of Hugging Face checkpoints: key names, fused/per-expert MoE forms, and the mapping between them.

One file because the key rules, the piece model, the planner that accounts for it and the whole-dict
conversions built on it are the one layout engine that conversion and merge share, so they stay in one
module.

One checkpoint can name and shape the same weights in several ways:

- **Key names.** transformers v5 keeps VLM text weights under ``model.language_model.*`` and the vision
  tower under ``model.visual.*`` in memory, while e.g. Qwen2.5-VL checkpoints on disk use ``model.layers.*``
  and ``visual.*``. The renames come from transformers itself (``conversion_mapping.py``, the
  ``WeightRenaming`` transforms it applies when loading), evaluated on a meta-device model built from the
  base's ``config.json``; :class:`KeyMapper` wraps them. Where no config is at hand (a merge of
  consolidated checkpoints), :meth:`KeyMapper.for_keys` applies the same renamings transformers declares
  for Qwen VLMs (:data:`VLM_RENAMINGS`) when the keys are a VLM's, and none otherwise.
- **MoE experts.** In memory (v5) a layer's experts are fused: ``…mlp.experts.gate_up_proj`` of shape
  ``(E, 2I, H)`` = ``cat([gate_e, up_e])`` per expert and ``…mlp.experts.down_proj`` ``(E, H, I)``. On disk
  they are per-expert ``…mlp.experts.{e}.gate_proj.weight`` ``(I, H)`` / ``up_proj`` ``(I, H)`` /
  ``down_proj`` ``(H, I)`` (qwen3_moe, qwen3_5_moe), fused as in memory (qwen3_vl_moe written by
  transformers 5.24's ``save_pretrained``) or fused and transposed, ``(E, H, 2I)`` / ``(E, I, H)``
  (Qwen3-VL-MoE checkpoints on the Hub; transformers loads both fused forms). A fused pair's orientation is read from the two shapes (in memory iff
  ``gate_up = (E, 2·d, c)`` and ``down = (E, c, d)``; transposed iff ``gate_up = (E, c, 2·d)`` and
  ``down = (E, d, c)``), which can never both hold.

Everything is reduced to one **canonical piece** space: in-memory key names, experts as per-expert
``nn.Linear`` matrices (``{experts}.{e}.gate_proj.weight`` …). Every tensor *provides* (source) or
*requires* (target) a list of pieces; :func:`plan_layout` matches the two sides piece by piece and does the
strict accounting (missing, extra, duplicated, mismatched). A :class:`LayoutPlan` then yields each target
tensor as a stream of contiguous chunks (:meth:`LayoutPlan.chunks`, at most one expert's worth of copied
memory at a time) or as one tensor (:meth:`LayoutPlan.materialize`).

Tied embeddings are explicit: when the model ties ``lm_head.weight`` to the input embedding, a source
``lm_head.weight`` that no target requires is accepted only as a declared alias of the embedding (its
bytes are checked equal by :meth:`LayoutPlan.tie_mismatches`), and a target ``lm_head.weight`` that no
source provides is filled from the embedding; both are listed in ``LayoutPlan.tied``.

Public API: :class:`TensorInfo`, :data:`DTYPES`, :class:`KeyMapper`, :func:`describe`, :func:`plan_layout`,
:class:`LayoutPlan`, :class:`Accounting`, :func:`to_in_memory`, :func:`to_on_disk`. ``conversion/`` plans a
checkpoint against the base's on-disk tensors; ``merge/`` plans every input against its first expert and
reads and writes each canonical piece through :meth:`Described.extract` views, so no layout is copied.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import InvalidRecord, Refused
from .dtypes import TensorInfo

GetTensor = Callable[[str], torch.Tensor]

# safetensors dtype names <-> torch dtypes (the names both sides of a conversion are compared by).
DTYPES: dict[str, torch.dtype] = {
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I8": torch.int8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
}
DTYPE_NAMES: dict[torch.dtype, str] = {v: k for k, v in DTYPES.items()}
for _name, _attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _attr):
        DTYPES[_name] = getattr(torch, _attr)
        DTYPE_NAMES[getattr(torch, _attr)] = _name

_PER_EXPERT = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
_FUSED = re.compile(r"^(?P<prefix>.+\.experts)\.(?P<proj>gate_up_proj|down_proj)$")
# The renamings transformers' conversion_mapping declares for Qwen VLMs (on-disk -> in-memory names), and
# the key prefixes that make a checkpoint a VLM's in either space.
VLM_RENAMINGS: tuple[tuple[str, str], ...] = (
    (r"^visual", "model.visual"),
    (r"^model(?!\.(language_model|visual))", "model.language_model"),
)
VLM_PREFIXES = ("model.language_model.", "model.visual.", "visual.")


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise InvalidRecord(f"tensor dtype {dtype} has no safetensors name", remedy="cast it to bf16/fp16/fp32") from None


@dataclass(frozen=True)
class Described:
    """One tensor of a checkpoint seen through the canonical piece space.

    ``form`` is ``"plain"`` (any non-expert tensor), ``"expert"`` (one per-expert Linear weight) or
    ``"fused"`` (a layer's experts in one tensor; then ``proj`` is ``gate_up``/``down``, ``transposed`` says
    whether it is the hub's ``(E, H, 2I)`` form, and ``experts``/``inter``/``hidden`` are E, I, H).
    """

    key: str
    canonical: str
    info: TensorInfo
    form: str = "plain"
    prefix: str = ""
    proj: str = ""
    transposed: bool = False
    experts: int = 0
    inter: int = 0
    hidden: int = 0

    def pieces(self) -> list[tuple[str, tuple[int, ...]]]:
        """The canonical pieces this tensor holds, with each piece's shape in Linear (out, in) orientation."""
        if self.form != "fused":
            return [(self.canonical, self.info.shape)]
        if self.proj == "gate_up":
            shape = (self.inter, self.hidden)
            return [
                (f"{self.prefix}.{e}.{p}.weight", shape) for e in range(self.experts) for p in ("gate_proj", "up_proj")
            ]
        return [(f"{self.prefix}.{e}.down_proj.weight", (self.hidden, self.inter)) for e in range(self.experts)]

    def extract(self, tensor: torch.Tensor, piece: str) -> torch.Tensor:
        """The view of ``tensor`` (this description's tensor) holding ``piece``, in Linear orientation."""
        if self.form != "fused":
            return tensor
        m = _PER_EXPERT.match(piece)
        assert m is not None and m["prefix"] == self.prefix, piece
        e, i = int(m["e"]), self.inter
        if self.proj == "gate_up":
            lo, hi = (0, i) if m["proj"] == "gate_proj" else (i, 2 * i)
            return tensor[e, :, lo:hi].T if self.transposed else tensor[e, lo:hi]
        return tensor[e].T if self.transposed else tensor[e]

    def assemble(self, get_piece: Callable[[str], torch.Tensor]) -> Iterator[torch.Tensor]:
        """This (target) tensor's bytes as contiguous chunks, in storage order, built from canonical pieces."""
        if self.form != "fused":
            yield get_piece(self.canonical).contiguous()
            return
        for e in range(self.experts):
            if self.proj == "gate_up":
                gate = get_piece(f"{self.prefix}.{e}.gate_proj.weight")
                up = get_piece(f"{self.prefix}.{e}.up_proj.weight")
                if self.transposed:
                    yield torch.cat([gate, up], dim=0).T.contiguous()
                else:
                    yield gate.contiguous()
                    yield up.contiguous()
            else:
                down = get_piece(f"{self.prefix}.{e}.down_proj.weight")
                yield down.T.contiguous() if self.transposed else down.contiguous()


class KeyMapper:
    """Maps a checkpoint key (on-disk or in-memory name) to its transformers-v5 in-memory name.

    Built from the base's config with :meth:`for_base`: the renamings are those transformers applies when
    it loads that architecture; ``tied`` maps a tied parameter to its source (``{"lm_head.weight":
    "model.embed_tokens.weight"}`` when ``tie_word_embeddings``); ``in_memory`` holds the meta model's
    parameter names and shapes. ``source`` says where the mapping came from (``transformers:<class>`` or
    ``identity`` when transformers does not know the architecture).
    """

    def __init__(
        self,
        renamings: list[Any],
        tied: Mapping[str, str],
        *,
        source: str,
        model_type: str | None = None,
        in_memory: Mapping[str, TensorInfo] | None = None,
        rules: tuple[tuple[str, str], ...] = (),
    ):
        self._renamings = list(renamings)
        self._rules = [(re.compile(pattern), repl) for pattern, repl in rules]
        self.tied = dict(tied)
        self.source = source
        self.model_type = model_type
        self.in_memory = dict(in_memory or {})

    def to_in_memory(self, key: str) -> str:
        for pattern, repl in self._rules:
            key = pattern.sub(repl, key, count=1)
        if not self._renamings:
            return key
        from transformers.core_model_loading import apply_renamings

        return apply_renamings(key, self._renamings)

    @classmethod
    def identity(cls, tied: Mapping[str, str] | None = None) -> KeyMapper:
        return cls([], tied or {}, source="identity")

    @classmethod
    def for_keys(cls, keys: Iterable[str], config: Mapping[str, Any] | None = None) -> KeyMapper:
        """The mapping for checkpoints holding ``keys`` when no transformers model is built from a config.

        Keys with a VLM prefix (in-memory or on-disk) get :data:`VLM_RENAMINGS`; others keep their
        names. ``config`` (a ``config.json``), when given, declares the tied embedding (in-memory names).
        """
        vlm = any(key.startswith(VLM_PREFIXES) for key in keys)
        mapper = cls([], {}, source="rules:qwen-vlm" if vlm else "identity", rules=VLM_RENAMINGS if vlm else ())
        tied = tied_from_config(config or {})
        mapper.tied = {mapper.to_in_memory(a): mapper.to_in_memory(b) for a, b in tied.items()}
        return mapper

    @classmethod
    def for_base(cls, base_dir: Path | str) -> KeyMapper:
        """The mapping transformers uses for the architecture in ``base_dir/config.json``."""
        import transformers
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightRenaming

        config = transformers.AutoConfig.from_pretrained(str(base_dir))
        model_cls = _model_class(transformers, config)
        if model_cls is None:
            return cls([], tied_from_config(config.to_dict()), source="identity", model_type=config.model_type)
        with torch.device("meta"):  # parameters get shapes, no memory
            model = model_cls._from_config(config)
        transforms = get_model_conversion_mapping(model, add_legacy=True)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        tied = dict(getattr(model, "all_tied_weights_keys", None) or {})
        in_memory = {k: TensorInfo(tuple(v.shape), None) for k, v in model.state_dict().items()}
        return cls(
            renamings, tied, source=f"transformers:{model_cls.__name__}", model_type=config.model_type, in_memory=in_memory
        )


def _model_class(transformers: Any, config: Any) -> Any:
    for name in getattr(config, "architectures", None) or []:
        found = getattr(transformers, name, None)
        if found is not None:
            return found
    for auto in ("AutoModelForImageTextToText", "AutoModelForCausalLM"):
        mapping = getattr(getattr(transformers, auto), "_model_mapping", None)
        if mapping is not None and type(config) in mapping:
            return mapping[type(config)]
    return None


def tied_from_config(config: Mapping[str, Any]) -> dict[str, str]:
    """``{"lm_head.weight": "model.embed_tokens.weight"}`` when ``config.json`` ties the word embeddings."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else {}
    if config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)):
        return {"lm_head.weight": "model.embed_tokens.weight"}
    return {}


def describe(infos: Mapping[str, TensorInfo], mapper: KeyMapper, *, what: str) -> dict[str, Described]:
    """Classify every tensor of one checkpoint (``what`` names it in errors); fused experts are read as pairs."""
    renamed = {key: mapper.to_in_memory(key) for key in infos}
    fused: dict[str, dict[str, str]] = {}
    out: dict[str, Described] = {}
    for key, canon in renamed.items():
        info = infos[key]
        if m := _FUSED.match(canon):
            proj = "gate_up" if m["proj"] == "gate_up_proj" else "down"
            pair = fused.setdefault(m["prefix"], {})
            if proj in pair:
                raise InvalidRecord(
                    f"{what}: {pair[proj]} and {key} are both {canon}",
                    remedy="keep one name per weight (on-disk or in-memory) and re-export the checkpoint",
                )
            pair[proj] = key
        elif _PER_EXPERT.match(canon):
            out[key] = Described(key, canon, info, form="expert")
        else:
            out[key] = Described(key, canon, info)
    for prefix, pair in fused.items():
        if set(pair) != {"gate_up", "down"}:
            have = next(iter(pair.values()))
            raise InvalidRecord(
                f"{what}: fused experts {prefix} have {have} but no fused "
                f"{'down_proj' if 'gate_up' in pair else 'gate_up_proj'}",
                remedy="a fused expert layer needs both gate_up_proj and down_proj; re-export the checkpoint",
            )
        gu, dn = infos[pair["gate_up"]].shape, infos[pair["down"]].shape
        if len(gu) != 3 or len(dn) != 3 or gu[0] != dn[0]:
            raise InvalidRecord(
                f"{what}: fused experts {prefix} have shapes gate_up {list(gu)} and down {list(dn)}",
                remedy="fused experts must be (E, 2I, H)/(E, H, I) or the transposed hub form (E, H, 2I)/(E, I, H)",
            )
        e = gu[0]
        if gu[1] == 2 * dn[2] and gu[2] == dn[1]:
            transposed, inter, hidden = False, dn[2], dn[1]
        elif gu[2] == 2 * dn[1] and gu[1] == dn[2]:
            transposed, inter, hidden = True, dn[1], dn[2]
        else:
            raise InvalidRecord(
                f"{what}: fused experts {prefix} have shapes gate_up {list(gu)} and down {list(dn)}, neither "
                "(E, 2I, H)/(E, H, I) nor the transposed (E, H, 2I)/(E, I, H)",
                remedy="check that the checkpoint belongs to this base model",
            )
        for proj, key in pair.items():
            out[key] = Described(
                key, renamed[key], infos[key], form="fused", prefix=prefix, proj=proj,
                transposed=transposed, experts=e, inter=inter, hidden=hidden,
            )
    return {key: out[key] for key in infos}


@dataclass
class Accounting:
    """Result of matching a source checkpoint against a target layout; empty lists mean a complete match."""

    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    mismatched: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.duplicated or self.mismatched)

    def summary(self, limit: int = 20) -> str:
        parts = []
        for name, items in (
            ("missing", self.missing), ("extra", self.extra),
            ("produced twice", self.duplicated), ("mismatched", self.mismatched),
        ):
            if items:
                shown = ", ".join(items[:limit])
                more = f" (+{len(items) - limit} more)" if len(items) > limit else ""
                parts.append(f"{len(items)} {name}: {shown}{more}")
        return "; ".join(parts) if parts else "complete"

    def to_dict(self, limit: int = 20) -> dict[str, Any]:
        return {
            name: {"count": len(items), "first": items[:limit]}
            for name, items in (
                ("missing", self.missing), ("extra", self.extra),
                ("duplicated", self.duplicated), ("mismatched", self.mismatched),
            )
        }


@dataclass
class LayoutPlan:
    """How each target tensor is built from source tensors (see the module doc)."""

    sources: dict[str, Described]
    targets: dict[str, Described]
    # canonical piece -> (source key, the source's piece it is read from); differs only for a filled tie
    piece_source: dict[str, tuple[str, str]]
    accounting: Accounting
    # target or source key -> what was done for a tied weight, e.g. "filled from model.embed_tokens.weight"
    tied: dict[str, str]
    # source alias key -> the source key it must equal bitwise (a tied lm_head dropped from the output)
    tie_aliases: dict[str, str]

    def require_complete(self, *, source: str, target: str) -> None:
        """Raise ``Refused`` (with ``.accounting``) unless every key is produced and consumed exactly once."""
        if self.accounting.ok:
            return
        err = Refused(
            f"{source} does not match {target}: {self.accounting.summary()}",
            remedy="use the base model this checkpoint was trained from, or re-export the checkpoint",
        )
        err.accounting = self.accounting  # type: ignore[attr-defined]
        raise err

    def source_keys(self, target: str) -> list[str]:
        """The source keys a target tensor is read from, in first-use order."""
        seen: dict[str, None] = {}
        for piece, _shape in self.targets[target].pieces():
            seen.setdefault(self.piece_source[piece][0], None)
        return list(seen)

    def chunks(self, target: str, get_tensor: GetTensor) -> Iterator[torch.Tensor]:
        """The target tensor's bytes as contiguous chunks (at most one expert is copied at a time)."""
        cache: dict[str, torch.Tensor] = {}

        def get_piece(piece: str) -> torch.Tensor:
            src_key, src_piece = self.piece_source[piece]
            if src_key not in cache:
                cache[src_key] = get_tensor(src_key)
            return self.sources[src_key].extract(cache[src_key], src_piece)

        yield from self.targets[target].assemble(get_piece)

    def materialize(self, target: str, get_tensor: GetTensor) -> torch.Tensor:
        """The whole target tensor (a copy unless it is a plain tensor that is already contiguous)."""
        desc = self.targets[target]
        parts = list(self.chunks(target, get_tensor))
        if len(parts) == 1 and tuple(parts[0].shape) == desc.info.shape:
            return parts[0]
        return torch.cat([p.reshape(-1) for p in parts]).reshape(desc.info.shape)

    def tie_mismatches(self, get_tensor: GetTensor) -> list[str]:
        """Source aliases of a tied weight whose bytes differ from the weight they are tied to."""
        bad = []
        for alias, original in sorted(self.tie_aliases.items()):
            if not bitwise_equal(get_tensor(alias), get_tensor(original)):
                bad.append(f"{alias} differs from {original}, but the base ties them (tie_word_embeddings)")
        return bad


def plan_layout(
    sources: Mapping[str, TensorInfo],
    targets: Mapping[str, TensorInfo],
    mapper: KeyMapper,
    *,
    source_name: str = "checkpoint",
    target_name: str = "base",
) -> LayoutPlan:
    """Match ``sources`` to ``targets`` piece by piece; the plan's ``accounting`` lists every discrepancy."""
    src = describe(sources, mapper, what=source_name)
    tgt = describe(targets, mapper, what=target_name)
    acc = Accounting()

    provided: dict[str, list[tuple[str, tuple[int, ...]]]] = {}
    for key, d in src.items():
        for piece, shape in d.pieces():
            provided.setdefault(piece, []).append((key, shape))
    required: dict[str, tuple[str, tuple[int, ...]]] = {}
    for key, d in tgt.items():
        for piece, shape in d.pieces():
            required[piece] = (key, shape)

    piece_source: dict[str, tuple[str, str]] = {}
    for piece, users in provided.items():
        if len(users) > 1:
            acc.duplicated.append(f"{piece} <- {', '.join(k for k, _ in users)}")
        piece_source[piece] = (users[0][0], piece)

    tied: dict[str, str] = {}
    tie_aliases: dict[str, str] = {}
    # in-memory names of tied pairs, e.g. lm_head.weight -> model.embed_tokens.weight
    for alias, original in mapper.tied.items():
        if alias in provided and alias not in required and original in required and original in provided:
            src_key = provided[alias][0][0]
            tie_aliases[src_key] = provided[original][0][0]
            tied[src_key] = f"not written: tied to {original} in the base (bytes checked equal)"
        elif alias in required and alias not in provided and original in provided:
            piece_source[alias] = piece_source[original]
            tied[required[alias][0]] = f"filled from {provided[original][0][0]} (tie_word_embeddings)"

    missing_targets: dict[str, None] = {}
    for piece, (tkey, tshape) in required.items():
        if piece not in piece_source:
            missing_targets.setdefault(tkey, None)
            continue
        skey, spiece = piece_source[piece]
        sshape = provided[spiece][0][1]
        if tuple(sshape) != tuple(tshape):
            acc.mismatched.append(f"{tkey}: shape {list(tshape)} in {target_name}, {list(sshape)} from {skey}")
    acc.missing = list(missing_targets)

    extra: dict[str, None] = {}
    for key, d in src.items():
        if key in tie_aliases:
            continue
        if any(piece not in required for piece, _ in d.pieces()):
            extra.setdefault(key, None)
    acc.extra = list(extra)

    for tkey, d in tgt.items():
        if d.info.dtype is None or tkey in missing_targets:
            continue
        for piece, _shape in d.pieces():
            skey = piece_source[piece][0]
            if src[skey].info.dtype != d.info.dtype:
                acc.mismatched.append(
                    f"{tkey}: dtype {d.info.dtype} in {target_name}, {src[skey].info.dtype} from {skey}"
                )
                break
    acc.mismatched = list(dict.fromkeys(acc.mismatched))
    for alias in tie_aliases:
        if src[alias].info != src[tie_aliases[alias]].info:
            acc.mismatched.append(
                f"{alias}: {src[alias].info} but tied to {tie_aliases[alias]} {src[tie_aliases[alias]].info}"
            )
    return LayoutPlan(src, tgt, piece_source, acc, tied, tie_aliases)


def bitwise_equal(a: torch.Tensor, b: torch.Tensor, *, block_bytes: int = 64 << 20) -> bool:
    """Same dtype, shape and bytes (NaN payloads included), compared in blocks so memory stays bounded."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    a, b = a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    for start in range(0, a.numel(), block_bytes):
        if not torch.equal(a[start : start + block_bytes], b[start : start + block_bytes]):
            return False
    return True


def to_in_memory(
    state_dict: Mapping[str, torch.Tensor], mapper: KeyMapper, *, what: str = "state dict"
) -> dict[str, torch.Tensor]:
    """Normalise a state dict (on-disk or in-memory names, any expert form) to the v5 in-memory layout.

    The target is the meta model's parameter set (``mapper.in_memory``, from :meth:`KeyMapper.for_base`),
    so the result loads with ``model.load_state_dict(..., strict=True)``; a tied ``lm_head.weight`` is
    filled from (and shares storage with) the embedding. Raises ``Refused`` on any accounting mismatch.
    """
    if not mapper.in_memory:
        raise Refused(f"{what}: no in-memory layout known for this base", remedy="build the mapper with KeyMapper.for_base")
    infos = {k: TensorInfo.of(v) for k, v in state_dict.items()}
    plan = plan_layout(infos, mapper.in_memory, mapper, source_name=what, target_name="in-memory model")
    plan.require_complete(source=what, target="the in-memory model")
    return _realize(plan, state_dict)


def to_on_disk(
    state_dict: Mapping[str, torch.Tensor],
    base_infos: Mapping[str, TensorInfo],
    mapper: KeyMapper,
    *,
    what: str = "state dict",
) -> dict[str, torch.Tensor]:
    """Rewrite a state dict into the base's on-disk layout (``base_infos``: the base's tensors by key)."""
    infos = {k: TensorInfo.of(v) for k, v in state_dict.items()}
    plan = plan_layout(infos, base_infos, mapper, source_name=what, target_name="base")
    plan.require_complete(source=what, target="the base")
    mismatched = plan.tie_mismatches(state_dict.__getitem__)
    if mismatched:
        raise Refused(f"{what}: {'; '.join(mismatched)}", remedy="untie the base or re-export the checkpoint")
    return _realize(plan, state_dict)


def _realize(plan: LayoutPlan, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for key in plan.targets:
        piece = plan.targets[key].canonical
        src_key, _ = plan.piece_source.get(piece, (None, None))
        # A tied target filled from a plain source shares its storage, like the model's own state_dict().
        if plan.targets[key].form == "plain" and src_key is not None and plan.sources[src_key].form == "plain":
            out[key] = state_dict[src_key]
        else:
            out[key] = plan.materialize(key, state_dict.__getitem__)
    return out
