"""One key space for every merge input, whatever layout it was saved in.

Two layouts of the same Hugging Face model meet in a merge (see FACTS.md, "MoE layouts"):

* transformers v5 in memory: MoE experts fused per layer, ``<layer>.mlp.experts.gate_up_proj``
  ``(E, 2I, H)`` (each expert's ``cat([gate, up])``) and ``<layer>.mlp.experts.down_proj`` ``(E, H, I)``;
  VLM text weights under ``model.language_model.*`` and the vision tower under ``model.visual.*``;
* on disk (``save_pretrained``): one tensor per expert, ``<layer>.mlp.experts.<e>.gate_proj.weight``
  ``(I, H)``, ``up_proj`` ``(I, H)``, ``down_proj`` ``(H, I)``; legacy VLM names ``model.layers.*``,
  ``visual.*``.

The *canonical* key space is the on-disk one: per-expert tensors, legacy prefixes. Every input is
described as ``canonical key -> Ref(source key, index)``, where ``index`` selects a view of the source
tensor (one expert's rows of a fused tensor): normalising a layout never copies a byte. Arithmetic
happens per canonical tensor; the output keeps the first expert's own names and layout, each output
tensor assembled from the canonical pieces it holds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ..errors import Refused
from .reader import TensorInfo

FUSED_RE = re.compile(r"^(?P<pre>.+\.experts)\.(?P<kind>gate_up_proj|down_proj)$")
PER_EXPERT_RE = re.compile(r"^(?P<pre>.+\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
# (v5 in-memory prefix, legacy on-disk prefix), as transformers' conversion mapping for Qwen VLMs.
PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))
SHOW = 5  # how many offending keys a refusal lists

Index = tuple[int | slice, ...]


@dataclass(frozen=True, slots=True)
class Ref:
    """Canonical tensor = ``source.tensor(key)[index]`` (a view), with this shape and dtype."""

    key: str
    index: Index
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class Piece:
    """The part ``index`` of an output tensor holds canonical tensor ``canon``."""

    index: Index
    canon: str


@dataclass(frozen=True, slots=True)
class OutputTensor:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    pieces: tuple[Piece, ...]
    alias_of: str | None = None  # tied weight: same storage as this earlier output tensor

    @property
    def nbytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True, slots=True)
class Layout:
    """How one input was saved: ``experts`` is fused, per-expert or none; ``prefix`` v5 or legacy."""

    experts: str
    prefix: str

    def describe(self) -> str:
        return f"{self.experts} experts, {self.prefix} prefixes"


def canonical_name(key: str) -> str:
    for v5, legacy in PREFIXES:
        if key.startswith(v5):
            return legacy + key[len(v5):]
    return key


def detect_layout(keys: list[str]) -> Layout:
    fused = any(FUSED_RE.match(k) for k in keys)
    per_expert = any(PER_EXPERT_RE.match(k) for k in keys)
    experts = "mixed" if fused and per_expert else "fused" if fused else "per-expert" if per_expert else "no"
    v5 = any(k.startswith(v5) for k in keys for v5, _ in PREFIXES)
    return Layout(experts=experts, prefix="v5" if v5 else "legacy")


def decompose(info: Mapping[str, TensorInfo], what: str) -> dict[str, list[tuple[str, Ref]]]:
    """For each source key, the canonical tensors it holds: ``[(canonical key, Ref), ...]``."""
    out: dict[str, list[tuple[str, Ref]]] = {}
    for key, ti in info.items():
        m = FUSED_RE.match(key)
        if m is None:
            out[key] = [(canonical_name(key), Ref(key, (), ti.shape, ti.dtype))]
            continue
        pre = canonical_name(m["pre"])
        if len(ti.shape) != 3:
            raise Refused(f"{what}: fused expert tensor {key} has shape {ti.shape}, expected 3 dimensions",
                          remedy="pass experts saved by transformers (fused (E, 2I, H) / (E, H, I)) or per expert")
        n_exp = ti.shape[0]
        if m["kind"] == "down_proj":
            out[key] = [(f"{pre}.{e}.down_proj.weight", Ref(key, (e,), ti.shape[1:], ti.dtype)) for e in range(n_exp)]
            continue
        if ti.shape[1] % 2:
            raise Refused(f"{what}: fused tensor {key} has shape {ti.shape}; dimension 1 must be 2 x intermediate",
                          remedy="gate_up_proj is (E, 2I, H) in transformers v5")
        inter = ti.shape[1] // 2
        half = (inter, ti.shape[2])
        pieces = []
        for e in range(n_exp):
            pieces.append((f"{pre}.{e}.gate_proj.weight", Ref(key, (e, slice(0, inter)), half, ti.dtype)))
            pieces.append((f"{pre}.{e}.up_proj.weight", Ref(key, (e, slice(inter, 2 * inter)), half, ti.dtype)))
        out[key] = pieces
    return out


def canonical_refs(info: Mapping[str, TensorInfo], what: str) -> dict[str, Ref]:
    """``canonical key -> Ref`` for one input; two source keys landing on one canonical key are refused."""
    refs: dict[str, Ref] = {}
    for key, pieces in decompose(info, what).items():
        for canon, ref in pieces:
            if canon in refs:
                raise Refused(f"{what}: tensors {refs[canon].key} and {key} are the same weight ({canon}) "
                              "in two layouts", remedy="save the checkpoint in one layout")
            refs[canon] = ref
    return refs


def output_plan(info: Mapping[str, TensorInfo], what: str) -> list[OutputTensor]:
    """The output tensors, in the first expert's names, order and layout."""
    plan = []
    for key, pieces in decompose(info, what).items():
        ti = info[key]
        plan.append(OutputTensor(key, ti.shape, ti.dtype, tuple(Piece(ref.index, canon) for canon, ref in pieces)))
    return plan


def storage_signature(t: torch.Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def with_ties(plan: list[OutputTensor], experts_refs: list[dict[str, Ref]], experts: list) -> list[OutputTensor]:
    """Mark an output tensor as an alias of an earlier one when it is the *same* tensor in every expert.

    Tied weights (``lm_head.weight`` sharing ``embed_tokens``' storage) then stay tied in the output and
    are computed once; if any expert holds them separately they are merged separately.
    """
    first_by_sig: dict[tuple, str] = {}
    rep: dict[str, str] = {}
    for out in plan:
        if len(out.pieces) != 1 or out.pieces[0].index != ():
            continue
        sig = storage_signature(experts[0].tensor(experts_refs[0][out.pieces[0].canon].key))
        if sig in first_by_sig:
            rep[out.name] = first_by_sig[sig]
        else:
            first_by_sig[sig] = out.name
    by_name = {o.name: o for o in plan}
    result = []
    for out in plan:
        target = rep.get(out.name)
        if target is not None and all(
            _same_storage(exp, refs, by_name[target].pieces[0].canon, out.pieces[0].canon)
            for exp, refs in zip(experts[1:], experts_refs[1:], strict=True)
        ):
            out = OutputTensor(out.name, out.shape, out.dtype, out.pieces, alias_of=target)
        result.append(out)
    return result


def _same_storage(expert, refs: dict[str, Ref], canon_a: str, canon_b: str) -> bool:
    ra, rb = refs[canon_a], refs[canon_b]
    if ra.index != () or rb.index != ():
        return False
    return storage_signature(expert.tensor(ra.key)) == storage_signature(expert.tensor(rb.key))


def check_same_keys(reference: dict[str, Ref], other: dict[str, Ref], ref_what: str, what: str) -> None:
    """Refuse, naming the first few keys, unless both inputs hold the same canonical tensors alike."""
    missing = [k for k in reference if k not in other]
    extra = [k for k in other if k not in reference]
    if missing or extra:
        raise Refused(
            f"{what} does not hold the same tensors as {ref_what} after layout normalisation: "
            f"{len(missing)} missing (first: {missing[:SHOW]}), {len(extra)} extra (first: {extra[:SHOW]})",
            remedy="merge experts of one architecture, each a full state dict",
        )
    _check_shapes(reference, other, ref_what, what, check_dtype=True)


def check_base_covers(reference: dict[str, Ref], base: dict[str, Ref], what: str, base_what: str) -> None:
    missing = [k for k in reference if k not in base]
    if missing:
        raise Refused(
            f"{base_what} lacks {len(missing)} tensors the experts hold (first: {missing[:SHOW]})",
            remedy="pass the base model the experts were trained from",
        )
    _check_shapes(reference, base, what, base_what, check_dtype=False)


def _check_shapes(reference: dict[str, Ref], other: dict[str, Ref], ref_what: str, what: str, *, check_dtype: bool) -> None:
    bad = [
        f"{k} {tuple(other[k].shape)}{' ' + str(other[k].dtype) if check_dtype else ''} vs "
        f"{tuple(r.shape)}{' ' + str(r.dtype) if check_dtype else ''}"
        for k, r in reference.items()
        if other[k].shape != r.shape or (check_dtype and other[k].dtype != r.dtype)
    ]
    if bad:
        raise Refused(f"{what} differs from {ref_what} in {len(bad)} tensor shapes/dtypes (first: {bad[:SHOW]})",
                      remedy="merge checkpoints of one architecture and dtype")


def tie_base_lm_head(base_refs: dict[str, Ref], reference: Mapping[str, Ref], tied: bool) -> None:
    """A base with tied embeddings stores ``embed_tokens`` only; the experts may list ``lm_head`` too."""
    head, embed = "lm_head.weight", "model.embed_tokens.weight"
    if tied and head in reference and head not in base_refs and embed in base_refs:
        base_refs[head] = base_refs[embed]
