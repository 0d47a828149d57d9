"""Every merge input seen in one key space, through the layout engine of ``conversion/layout.py``.

Two layouts of the same Hugging Face model meet in a merge (see FACTS.md, "MoE layouts"): transformers
v5 in memory (fused experts ``gate_up_proj`` ``(E, 2I, H)`` / ``down_proj`` ``(E, H, I)``, VLM text
weights under ``model.language_model.*``) and on disk (one tensor per expert, legacy ``model.layers.*``
/ ``visual.*``). The engine's canonical pieces (in-memory names, one Linear weight per expert) are the
unit of the arithmetic: every input is planned against the first expert with ``plan_layout``, and each
piece is read from its source, and written into the output, as a view (``Described.extract``), so
normalising a layout never copies a byte. The output keeps the first expert's names, order and layout.
The keys come without a config, so :meth:`KeyMapper.for_keys` supplies transformers' VLM renamings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..conversion.layout import (
    DTYPES,
    VLM_PREFIXES,
    Described,
    KeyMapper,
    LayoutPlan,
    TensorInfo,
    plan_layout,
)
from ..errors import Refused

SHOW = 5  # how many offending keys a refusal lists


@dataclass(frozen=True, slots=True)
class InputLayout:
    """One input (an expert or the base) planned against the first expert's pieces."""

    plan: LayoutPlan

    def key(self, piece: str) -> str:
        """The input's tensor that holds canonical ``piece``."""
        return self.plan.piece_source[piece][0]

    def view(self, source: Any, piece: str) -> torch.Tensor:
        """Canonical ``piece`` as a view of ``source``'s tensor (``source.tensor(key)``)."""
        key, src_piece = self.plan.piece_source[piece]
        return self.plan.sources[key].extract(source.tensor(key), src_piece)


@dataclass(frozen=True, slots=True)
class OutputTensor:
    """One output tensor: the first expert's ``desc``; each canonical piece is a view of it."""

    desc: Described
    alias_of: str | None = None  # tied weight: same storage as this earlier output tensor

    @property
    def name(self) -> str:
        return self.desc.key

    @property
    def shape(self) -> tuple[int, ...]:
        return self.desc.info.shape

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.desc.info.dtype]

    @property
    def pieces(self) -> list[str]:
        return [piece for piece, _shape in self.desc.pieces()]

    @property
    def nbytes(self) -> int:
        return self.desc.info.numel * torch.empty((), dtype=self.dtype).element_size()


@dataclass(frozen=True, slots=True)
class Layout:
    """How one input was saved: ``experts`` is fused, transposed fused (the Hub's), per-expert, mixed or
    none; ``prefix`` v5 or legacy."""

    experts: str
    prefix: str

    def describe(self) -> str:
        return f"{self.experts} experts, {self.prefix} prefixes"


def detect_layout(described: Mapping[str, Described]) -> Layout:
    fused = {"transposed fused" if d.transposed else "fused" for d in described.values() if d.form == "fused"}
    per_expert = any(d.form == "expert" for d in described.values())
    experts = ("mixed" if len(fused) > 1 or (fused and per_expert) else fused.pop() if fused
               else "per-expert" if per_expert else "no")
    v5 = any(key.startswith(VLM_PREFIXES[:2]) for key in described)
    return Layout(experts=experts, prefix="v5" if v5 else "legacy")


def key_mapper(infos: list[Mapping[str, TensorInfo]], config: Mapping[str, Any] | None = None) -> KeyMapper:
    """One mapper for all inputs of a merge (a VLM's if any input is one); ``config`` declares ties."""
    return KeyMapper.for_keys((key for info in infos for key in info), config)


def plan_expert(info: Mapping[str, TensorInfo], reference: Mapping[str, TensorInfo], mapper: KeyMapper,
                what: str, ref_what: str) -> InputLayout:
    """Refuse, naming the first few keys, unless ``info`` holds the reference's tensors alike, once each."""
    plan = plan_layout(info, reference, mapper, source_name=what, target_name=ref_what)
    if not plan.accounting.ok:
        raise Refused(
            f"{what} does not hold the same tensors as {ref_what} after layout normalisation: "
            f"{plan.accounting.summary(SHOW)}",
            remedy="merge experts of one architecture and dtype, each a full state dict saved in one layout",
        )
    return InputLayout(plan)


def plan_base(info: Mapping[str, TensorInfo], reference: Mapping[str, TensorInfo], mapper: KeyMapper,
              what: str) -> InputLayout:
    """The base must hold every tensor the experts hold, with the same shapes (any dtype; more is fine).

    A base that ties ``lm_head`` to the embedding (``mapper.tied``) stores the embedding only; the
    experts' ``lm_head`` is then read from it.
    """
    shapes_only = {key: TensorInfo(i.shape, None) for key, i in reference.items()}
    plan = plan_layout(info, shapes_only, mapper, source_name=what, target_name="the experts")
    acc = plan.accounting
    if acc.missing:
        raise Refused(f"{what} lacks {len(acc.missing)} tensors the experts hold (first: {acc.missing[:SHOW]})",
                      remedy="pass the base model the experts were trained from")
    if acc.mismatched or acc.duplicated:
        raise Refused(f"{what} differs from the experts: {acc.summary(SHOW)}",
                      remedy="merge checkpoints of one architecture; save the base in one layout")
    return InputLayout(plan)


def storage_signature(t: torch.Tensor) -> tuple:
    return (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def with_ties(plan: LayoutPlan, layouts: list[InputLayout], experts: list) -> list[OutputTensor]:
    """The output tensors (the first expert's), a tensor marked as an alias of an earlier one when it is
    the *same* tensor in every expert.

    Tied weights (``lm_head.weight`` sharing ``embed_tokens``' storage) then stay tied in the output and
    are computed once; if any expert holds them separately they are merged separately.
    """
    outputs = [OutputTensor(desc) for desc in plan.targets.values()]
    first_by_sig: dict[tuple, str] = {}
    rep: dict[str, str] = {}
    for out in outputs:
        if out.desc.form == "fused":  # only whole tensors can share storage
            continue
        sig = storage_signature(experts[0].tensor(out.name))
        if sig in first_by_sig:
            rep[out.name] = first_by_sig[sig]
        else:
            first_by_sig[sig] = out.name
    canonical = {out.name: out.desc.canonical for out in outputs}
    result = []
    for out in outputs:
        target = rep.get(out.name)
        if target is not None and all(
            _same_storage(exp, lay, canonical[target], out.desc.canonical)
            for exp, lay in zip(experts[1:], layouts[1:], strict=True)
        ):
            out = OutputTensor(out.desc, alias_of=target)
        result.append(out)
    return result


def _same_storage(expert, layout: InputLayout, piece_a: str, piece_b: str) -> bool:
    ka, kb = layout.key(piece_a), layout.key(piece_b)
    if layout.plan.sources[ka].form == "fused" or layout.plan.sources[kb].form == "fused":
        return False
    return storage_signature(expert.tensor(ka)) == storage_signature(expert.tensor(kb))
