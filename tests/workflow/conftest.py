"""Session fixtures for the workflow tests: a tiny real Qwen3 base and expert checkpoints, built once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.tiny_models import build_tiny_base, in_memory_state_dict, perturbed, save_consolidated


@dataclass(frozen=True)
class Kit:
    base: Path
    experts: list[Path]


@pytest.fixture(scope="session")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    """A tiny Qwen3 base and three experts (base + noise, ``{"net": state_dict}``); read-only by convention."""
    root = tmp_path_factory.mktemp("workflow-kit")
    base = build_tiny_base("qwen3", root / "base")
    state = in_memory_state_dict(base)
    experts = [save_consolidated(perturbed(state, 0.02, seed=i + 1), root / "experts" / f"e{i}.pt") for i in range(3)]
    return Kit(base, experts)
