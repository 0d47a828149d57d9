"""Plan a merge (open inputs, normalise layouts, refuse mismatches) and stream it into one file.

The plan is complete before a byte is written: every expert is opened and checked against the first,
the base against the experts, so a refused request writes nothing. The write computes one output
tensor at a time into a single reused buffer the size of the largest tensor, hands it to the
incremental writer, and moves on; a tensor tied in every expert (``lm_head`` sharing
``embed_tokens``) is computed once and stays tied.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .. import testhooks
from ..digest import FileDigest, sha256_file
from ..errors import VerificationFailed
from ..progress import ByteProgress
from .diagnostics import Diagnostics
from .layout import InputLayout, OutputTensor, detect_layout, key_mapper, plan_base, plan_expert, with_ties
from .methods import MergeMethod, make_method
from .reader import BaseModel, ExpertCheckpoint, PageReleaser, open_expert
from .writer import TorchSaveWriter


@dataclass
class MergePlan:
    method: MergeMethod
    experts: list[ExpertCheckpoint]
    expert_layouts: list[InputLayout]
    base: BaseModel | None
    base_layout: InputLayout | None
    outputs: list[OutputTensor]
    layout: str
    normalised: bool
    diagnostics: Diagnostics | None


def plan_merge(mode: str, lam: float | None, expert_paths: list[Path], base: BaseModel | None, *,
               diag: bool = False) -> MergePlan:
    method = make_method(mode, lam)
    opened: dict[Path, ExpertCheckpoint] = {}
    for path in expert_paths:
        if path not in opened:
            opened[path] = open_expert(path)
    experts = [opened[p] for p in expert_paths]
    infos = [e.info() for e in experts]
    base_info = None
    if base is not None:
        base.check_shards()
        base_info = base.info()
    mapper = key_mapper([*infos, *([base_info] if base_info is not None else [])])
    first = f"expert {experts[0].path}"
    layouts = [plan_expert(info, infos[0], mapper, f"expert {e.path}" if i else first, first)
               for i, (info, e) in enumerate(zip(infos, experts, strict=True))]
    saved = [detect_layout(lay.plan.sources) for lay in layouts]
    outputs = with_ties(layouts[0].plan, layouts, experts)
    base_layout = None
    if base is not None:
        base_mapper = key_mapper([*infos, base_info], base.config)
        base_layout = plan_base(base_info, infos[0], base_mapper, f"base {base.directory}")
        saved.append(detect_layout(base_layout.plan.sources))
    diagnostics = Diagnostics(mode, lam, [str(e.path) for e in experts]) if diag else None
    return MergePlan(
        method=method, experts=experts, expert_layouts=layouts, base=base, base_layout=base_layout,
        outputs=outputs, layout=saved[0].describe(), normalised=any(lay != saved[0] for lay in saved[1:]),
        diagnostics=diagnostics,
    )


def write_merged(plan: MergePlan, path: Path, *, progress: bool | None = None) -> tuple[FileDigest, dict[str, Any] | None]:
    """Write ``{"net": merged}`` to ``path`` (created exclusively), fsync it and verify it."""
    computed = [o for o in plan.outputs if o.alias_of is None]
    buffer = torch.empty(max((o.nbytes for o in computed), default=0), dtype=torch.uint8)
    diag = plan.diagnostics
    with TorchSaveWriter(path) as writer, ByteProgress(sum(o.nbytes for o in computed), "merge", progress) as bar:
        for n, out in enumerate(plan.outputs):
            if out.alias_of is not None:
                writer.add_alias(out.name, out.alias_of)
                continue
            tensor = buffer[: out.nbytes].view(out.dtype).view(out.shape)
            stats = diag.begin() if diag is not None else None
            consumed: list[tuple[PageReleaser | None, torch.Tensor]] = []
            for piece in out.pieces:
                experts = [lay.view(e, piece) for e, lay in zip(plan.experts, plan.expert_layouts, strict=True)]
                consumed += [(e.pages, x) for e, x in zip(plan.experts, experts, strict=True)]
                base = None
                if plan.base is not None:
                    base = plan.base_layout.view(plan.base, piece)
                    consumed.append((plan.base.pages(plan.base_layout.key(piece)), base))
                plan.method.merge(out.desc.extract(tensor, piece), experts, base, stats)
            for pages, view in consumed:  # RSS holds the tensors in flight, not every input byte read so far
                if pages is not None:
                    pages.release(view)
            writer.add(out.name, tensor)
            if diag is not None:
                diag.end(out.name, out.shape, stats)
            bar.update(out.nbytes)
            if n == 0:
                testhooks.reached("merge:mid-model-write")
        writer.finish()
    digest = FileDigest(writer.size, writer.sha256)
    verify_written(path, plan, digest)
    return digest, diag.to_dict() if diag is not None else None


def verify_written(path: Path, plan: MergePlan, digest: FileDigest) -> None:
    """Re-hash the file from disk and load its header: the keys, shapes and dtypes of the plan."""
    remedy = "the disk returned other bytes than were written; check the file system and rerun"
    again = sha256_file(path)
    if again != digest:
        raise VerificationFailed(f"merged {path} re-hashes to {again.sha256[:12]} ({again.size} bytes), "
                                 f"written as {digest.sha256[:12]} ({digest.size} bytes)", remedy=remedy)
    try:
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except (RuntimeError, ValueError, OSError) as exc:
        raise VerificationFailed(f"merged {path} does not load with torch.load(weights_only=True): {exc}",
                                 remedy=remedy) from None
    net = obj.get("net") if isinstance(obj, dict) else None
    if not isinstance(net, dict) or list(obj) != ["net"]:
        raise VerificationFailed(f"merged {path} is not {{'net': state_dict}}", remedy=remedy)
    expected = [(o.name, o.shape, o.dtype) for o in plan.outputs]
    found = [(k, tuple(t.shape), t.dtype) for k, t in net.items()]
    if found != expected:
        diff = [e for e, f in zip(expected, found, strict=False) if e != f][:3]
        raise VerificationFailed(f"merged {path} holds other tensors than planned "
                                 f"({len(found)} vs {len(expected)}; first differences {diff})", remedy=remedy)
