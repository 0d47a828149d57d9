"""Helpers for the merge tests: the exactness oracles, an independent layout converter, the real CLI.

The oracles are the merge methods' definitions written as plainly as possible (whole tensors, no chunking):
``avg = ((a.float() + b.float() + ...) / n).to(bf16)`` and
``tv = (base.float() + lam * ((e1.float() - base) + (e2.float() - base) + ...)).to(bf16)``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file

FUSED = re.compile(r"^(?P<pre>.+\.experts)\.(?P<kind>gate_up_proj|down_proj)$")


def avg_oracle(experts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    out = {}
    for key, first in experts[0].items():
        total = first.float()
        for e in experts[1:]:
            total = total + e[key].float()
        out[key] = (total / len(experts)).to(first.dtype)
    return out


def tv_oracle(base: dict[str, torch.Tensor], experts: list[dict[str, torch.Tensor]], lam: float) -> dict[str, torch.Tensor]:
    out = {}
    for key, first in experts[0].items():
        b = base[key].float()
        total = experts[0][key].float() - b
        for e in experts[1:]:
            total = total + (e[key].float() - b)
        out[key] = (b + lam * total).to(first.dtype)
    return out


def to_disk_layout(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers-v5 in-memory names/layout -> save_pretrained's (per expert, legacy VLM prefixes)."""
    out: dict[str, torch.Tensor] = {}
    for key, t in state_dict.items():
        key = key.replace("model.language_model.", "model.", 1).replace("model.visual.", "visual.", 1)
        m = FUSED.match(key)
        if m is None:
            out[key] = t.clone()
        elif m["kind"] == "down_proj":
            for e in range(t.shape[0]):
                out[f"{m['pre']}.{e}.down_proj.weight"] = t[e].clone()
        else:
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{m['pre']}.{e}.gate_proj.weight"] = t[e, :inter].clone()
                out[f"{m['pre']}.{e}.up_proj.weight"] = t[e, inter:].clone()
    return out


def disk_state_dict(base_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face directory's safetensors shards, under the names on disk."""
    index = json.loads((base_dir / "model.safetensors.index.json").read_text())
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        out.update(load_file(base_dir / shard))
    return out


def load_net(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)["net"]


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit identity (NaN payloads and the sign of zero included), not numerical closeness."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bytes(a.reshape(-1).contiguous().view(torch.uint8).numpy()) == bytes(
        b.reshape(-1).contiguous().view(torch.uint8).numpy()
    )


def assert_bits_equal(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(found) == list(expected)
    bad = [k for k in expected if not bits_equal(found[k], expected[k])]
    assert not bad, f"{len(bad)} tensors differ in their bits, first {bad[:3]}"



