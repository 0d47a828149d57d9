"""Session fixtures for the merge tests: tiny real Qwen3 / Qwen3-MoE bases and experts = base + noise.

Each expert exists in both layouts with the *same* values: ``mem`` (transformers-v5 in-memory
``state_dict()``: fused experts, tied ``lm_head`` sharing the embedding's storage) and ``disk``
(``save_pretrained``'s per-expert names). Experts are written once per session and never modified;
tests copy what they change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from merge_helpers import disk_state_dict, to_disk_layout

from helpers.tiny_models import build_tiny_base, in_memory_state_dict, perturbed, save_consolidated

N_EXPERTS = 3


@dataclass(frozen=True)
class ExpertSet:
    kind: str
    base: Path
    base_mem: dict[str, torch.Tensor]  # the base in the in-memory layout
    mem: list[dict[str, torch.Tensor]]  # expert state dicts, in-memory layout
    disk: list[dict[str, torch.Tensor]]  # the same values, on-disk layout
    mem_paths: list[Path]
    disk_paths: list[Path]

    def paths(self, layout: str = "mem") -> list[Path]:
        return self.mem_paths if layout == "mem" else self.disk_paths


def _expert_set(kind: str, root: Path) -> ExpertSet:
    base = build_tiny_base(kind, root / "base")
    base_mem = in_memory_state_dict(base)
    # The test's converter must agree with what transformers itself writes.
    disk_base = disk_state_dict(base)
    converted = to_disk_layout(base_mem)
    if kind == "qwen3":  # tied: save_pretrained omits lm_head
        converted.pop("lm_head.weight")
    assert sorted(converted) == sorted(disk_base)
    assert all(torch.equal(converted[k], disk_base[k]) for k in disk_base)
    mem = [perturbed(base_mem, 0.02, seed=i + 1) for i in range(N_EXPERTS)]
    disk = [to_disk_layout(sd) for sd in mem]
    mem_paths = [save_consolidated(sd, root / f"mem{i}" / "model.pt") for i, sd in enumerate(mem)]
    disk_paths = [save_consolidated(sd, root / f"disk{i}" / "model.pt") for i, sd in enumerate(disk)]
    return ExpertSet(kind, base, base_mem, mem, disk, mem_paths, disk_paths)


@pytest.fixture(scope="session")
def moe(tmp_path_factory: pytest.TempPathFactory) -> ExpertSet:
    """Qwen3-MoE: 4 experts per layer, 2I (96) != hidden (64), untied head."""
    return _expert_set("qwen3_moe", tmp_path_factory.mktemp("moe"))


@pytest.fixture(scope="session")
def dense(tmp_path_factory: pytest.TempPathFactory) -> ExpertSet:
    """Qwen3 dense with tied embeddings (the base's shards hold no lm_head)."""
    return _expert_set("qwen3", tmp_path_factory.mktemp("dense"))


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """A fresh ``<run>/checkpoint_artifacts/iter_000300/model.pt`` path (directory not created)."""
    return tmp_path / "run" / "checkpoint_artifacts" / "iter_000300" / "model.pt"
