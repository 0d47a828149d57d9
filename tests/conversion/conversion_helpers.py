"""Helpers for the conversion tests: the lazily built tiny models and file surgery on exports."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import torch

from ckptflow.conversion.hf import convert_checkpoint
from helpers import tiny_models as tm

# Small enough that every tiny export has several shards.
SHARD_CAP = 100_000
# A qwen3_vl_moe base in the Hub's on-disk form: fused experts transposed, (E, H, 2I) / (E, I, H).
HUB = "qwen3_vl_moe_hub"
ALL_KINDS = (*tm.KINDS, HUB)
MOE_KINDS = ("qwen3_moe", "qwen3_5_moe", "qwen3_vl_moe", HUB)


def model_kind(kind: str) -> str:
    """The tiny_models kind behind a fixture kind (the hub variant is a qwen3_vl_moe)."""
    return "qwen3_vl_moe" if kind == HUB else kind


class TinyModels:
    """Each tiny base kind built once per session, plus its perturbed checkpoint and its export.

    - ``base(kind)``: a tiny real HF base (tests/tiny_models.py);
    - ``state_dict(kind)``: its weights perturbed (a conversion that copied the base would be caught), in
      the transformers-v5 in-memory layout;
    - ``checkpoint(kind)``: that state dict saved as the consolidated ``model.pt``;
    - ``export(kind)``: ``convert_checkpoint`` of that checkpoint with a small shard cap (several shards).

    Paths are shared and read-only by convention: a test that damages a file works on ``copy_tree``.
    """

    def __init__(self, root: Path):
        self.root = root
        self._bases: dict[str, Path] = {}
        self._state: dict[str, dict[str, torch.Tensor]] = {}
        self._ckpt: dict[str, Path] = {}
        self._export: dict[str, Path] = {}

    def base(self, kind: str) -> Path:
        """``kind`` is a tiny_models kind, or ``"qwen3_vl_moe_hub"``: qwen3_vl_moe with experts transposed on disk."""
        if kind not in self._bases:
            if kind == HUB:
                path = tm.build_tiny_base("qwen3_vl_moe", self.root / "bases" / kind)
                assert tm.transpose_fused_experts(path)
            else:
                path = tm.build_tiny_base(kind, self.root / "bases" / kind)
            self._bases[kind] = path
        return self._bases[kind]

    def state_dict(self, kind: str) -> dict[str, torch.Tensor]:
        if kind not in self._state:
            if kind == HUB:  # the same weights as qwen3_vl_moe: only the base's on-disk form differs
                self._state[kind] = self.state_dict("qwen3_vl_moe")
            else:
                self._state[kind] = tm.perturbed(tm.in_memory_state_dict(self.base(kind)), scale=0.02, seed=1)
        return self._state[kind]

    def checkpoint(self, kind: str) -> Path:
        if kind not in self._ckpt:
            self._ckpt[kind] = tm.save_consolidated(self.state_dict(kind), self.root / "ckpt" / kind / "model.pt")
        return self._ckpt[kind]

    def export(self, kind: str) -> Path:
        if kind not in self._export:
            out = self.root / "exports" / kind
            convert_checkpoint(self.checkpoint(kind), self.base(kind), out, max_shard_bytes=SHARD_CAP)
            self._export[kind] = out
        return self._export[kind]


def copy_tree(src: Path, dst: Path) -> Path:
    """A writable copy of a shared fixture tree (symlinks copied as the files they point to)."""
    shutil.copytree(src, dst)
    return dst


def read_raw_header(path: Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the offset where its data starts."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]), 8 + n


def shard_of(export: Path, key: str) -> Path:
    index = json.loads((export / "model.safetensors.index.json").read_text())
    return export / index["weight_map"][key]


def flip_tensor_byte(export: Path, key: str, offset: int = 0) -> None:
    """Change one byte inside ``key``'s data, leaving the header intact."""
    path = shard_of(export, key)
    header, data_start = read_raw_header(path)
    pos = data_start + header[key]["data_offsets"][0] + offset
    raw = bytearray(path.read_bytes())
    raw[pos] ^= 0x01
    path.write_bytes(bytes(raw))


def base_tensors(directory: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors model directory, as stored on disk (names and layout untouched)."""
    from safetensors.torch import load_file

    index = json.loads((directory / "model.safetensors.index.json").read_text())
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(directory / shard)))
    return out


def assert_same_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Same keys, dtypes, shapes and bytes."""
    assert sorted(got) == sorted(want)
    for key in want:
        a, b = got[key], want[key]
        assert (a.dtype, a.shape) == (b.dtype, b.shape), key
        assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)), key


def add_tensor_to_base(base: Path, key: str, tensor: torch.Tensor) -> None:
    """Put one more tensor into the base's last shard and index (a copy of a fixture base, never the original)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    index_path = base / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = sorted(set(index["weight_map"].values()))[-1]
    with safe_open(str(base / shard), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
        metadata = f.metadata()
    tensors[key] = tensor.contiguous().clone()
    save_file(tensors, str(base / shard), metadata=metadata)
    index["weight_map"][key] = shard
    index["metadata"]["total_size"] += tensor.numel() * tensor.element_size()
    index_path.write_text(json.dumps(index, indent=2))


def drop_tensor(export: Path, key: str) -> None:
    """Remove one tensor from its shard and from the index (total_size kept consistent)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = shard_of(export, key)
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys() if k != key}
        metadata = f.metadata()
        removed = f.get_tensor(key)
    save_file(tensors, str(path), metadata=metadata)
    index_path = export / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    del index["weight_map"][key]
    index["metadata"]["total_size"] -= removed.numel() * removed.element_size()
    index_path.write_text(json.dumps(index, indent=2))
