"""Convert a consolidated ``model.pt`` into a Hugging Face model directory shaped like its base. No CLI.

``convert_checkpoint(model_pt, base_dir, out_dir)`` writes into ``out_dir`` (absent or empty; the caller
stages it and owns swaps, locks and markers) in this order:

1. read and validate the base (config.json, index, every shard header, every JSON/Jinja sidecar) and
   memory-map the checkpoint — nothing is written before both pass;
2. plan the layout (``layout.plan_layout``): strict key accounting against the base's on-disk tensors after
   key renaming and expert (un)fusing; a tied ``lm_head.weight`` is dropped only when bitwise equal to the
   embedding it is tied to; any discrepancy refuses with counts and the first 20 keys of each kind;
3. stream the tensors into shards ``model-0000K-of-0000N.safetensors`` in the base's tensor order, each at
   most ``max_shard_bytes`` of tensor data (a larger tensor gets a shard of its own), fsynced;
4. copy ``config.json`` and the sidecars byte for byte;
5. write ``model.safetensors.index.json`` last (``metadata.total_size`` + the full ``weight_map``).

Memory: source tensors are memory-mapped and written straight from the mapping; only reshaped expert
slices are copied, one expert at a time, so anonymous memory stays near the largest tensor at worst, and
a source tensor's mapped pages are dropped from the process once its last reader is written.
``verify_output`` (verify.py) checks the result.

A failure after step 1 leaves ``out_dir`` with some shards and no index: the caller discards its staged
directory (an index-less directory is never a usable export).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import Refused
from ..fsutil import fsync_dir
from ..progress import ByteProgress
from . import shards, sidecars
from .layout import Described, KeyMapper, LayoutPlan, plan_layout
from .source import Base, Checkpoint, open_checkpoint, read_base


@dataclass(frozen=True)
class ShardRecord:
    name: str
    size: int  # file bytes
    tensors: int


@dataclass(frozen=True)
class ConversionResult:
    out_dir: Path
    tensor_count: int
    total_size: int  # tensor bytes, as in the index's metadata.total_size
    shards: tuple[ShardRecord, ...]
    sidecars: tuple[str, ...]
    ignored: tuple[str, ...]  # base entries not carried over
    tied: dict[str, str] = field(default_factory=dict)  # key -> what was done for a tied weight
    source_layout: str = ""
    target_layout: str = ""
    mapping: str = ""  # where key renames came from: "transformers:<class>" or "identity"

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["out_dir"] = str(self.out_dir)
        out["shards"] = [asdict(s) for s in self.shards]
        out["sidecars"] = list(self.sidecars)
        out["ignored"] = list(self.ignored)
        return out


def plan_conversion(checkpoint: Checkpoint, base: Base) -> tuple[LayoutPlan, KeyMapper]:
    """The checked layout plan from ``checkpoint`` to ``base`` (``Refused`` on any accounting problem)."""
    mapper = KeyMapper.for_base(base.path)
    plan = plan_layout(
        checkpoint.infos(), base.infos(), mapper, source_name=f"checkpoint {checkpoint.path}", target_name="base"
    )
    plan.require_complete(source=f"checkpoint {checkpoint.path}", target=f"base {base.path}")
    bad = plan.tie_mismatches(checkpoint.tensors.__getitem__)
    if bad:
        raise Refused(
            f"checkpoint {checkpoint.path}: {'; '.join(bad)}",
            remedy="a tied base cannot hold a separate lm_head; use an untied base or re-export the checkpoint",
        )
    return plan, mapper


def describe_layout(described: dict[str, Described]) -> str:
    forms = {d.form for d in described.values()}
    if "fused" in forms:
        transposed = {d.transposed for d in described.values() if d.form == "fused"}
        kind = "transposed (E, H, 2I)" if transposed == {True} else "(E, 2I, H)" if transposed == {False} else "mixed"
        return f"experts fused {kind}" + (" + per-expert" if "expert" in forms else "")
    return "experts per-expert" if "expert" in forms else "dense"


def convert_checkpoint(
    model_pt: Path,
    base_dir: Path,
    out_dir: Path,
    *,
    max_shard_bytes: int = shards.DEFAULT_MAX_SHARD_BYTES,
    progress: bool | None = None,
    fsync: bool = True,
) -> ConversionResult:
    """Write the Hugging Face export of ``model_pt`` for ``base_dir`` into ``out_dir`` (see the module doc)."""
    out_dir = Path(out_dir)
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise Refused(
            f"output directory {out_dir} exists and is not empty",
            path=str(out_dir),
            remedy="convert into a fresh (staged) directory",
        )
    base = read_base(Path(base_dir))
    checkpoint = open_checkpoint(Path(model_pt))
    plan, mapper = plan_conversion(checkpoint, base)

    order = list(plan.targets)  # the base's order: shard by shard, data order
    sizes = [(k, shards.nbytes(plan.targets[k].info)) for k in order]
    groups = shards.plan_shards(sizes, max_shard_bytes)
    total = sum(n for _, n in sizes)

    out_dir.mkdir(parents=True, exist_ok=True)
    get = checkpoint.tensors.__getitem__

    # Each source tensor's mapped pages are dropped once the last target reading it is written.
    uses: dict[str, int] = {}
    for key in order:
        for src in plan.source_keys(key):
            uses[src] = uses.get(src, 0) + 1

    def chunks_then_release(key: str) -> Iterator[torch.Tensor]:
        yield from plan.chunks(key, get)
        for src in plan.source_keys(key):
            uses[src] -= 1
            if uses[src] == 0:
                checkpoint.release(src)

    weight_map: dict[str, str] = {}
    records: list[ShardRecord] = []
    with ByteProgress(total, "convert", enabled=progress) as bar:
        for k, keys in enumerate(groups, start=1):
            name = shards.shard_name(k, len(groups))
            infos = [(key, plan.targets[key].info) for key in keys]
            size = shards.write_shard(out_dir / name, infos, chunks_then_release, on_bytes=bar.update, fsync=fsync)
            records.append(ShardRecord(name, size, len(keys)))
            weight_map.update(dict.fromkeys(keys, name))
    sidecars.copy_sidecars(base.path, out_dir, base.sidecars.files)
    if fsync:
        _fsync_dirs(out_dir, base.sidecars.files)
    shards.write_index(out_dir, weight_map, total)  # last: an index names only complete, durable files
    return ConversionResult(
        out_dir=out_dir,
        tensor_count=len(weight_map),
        total_size=total,
        shards=tuple(records),
        sidecars=base.sidecars.files,
        ignored=base.sidecars.ignored,
        tied=dict(plan.tied),
        source_layout=describe_layout(plan.sources),
        target_layout=describe_layout(plan.targets),
        mapping=mapper.source,
    )


def _fsync_dirs(out_dir: Path, files: tuple[str, ...]) -> None:
    # out_dir's own entry lives in its parent: the caller fsyncs that when it renames the staged tree.
    for sub in sorted({Path(f).parent for f in files if "/" in f}):
        fsync_dir(out_dir / sub)
    fsync_dir(out_dir)
