"""Fixtures for the workflow tests: a tiny real Qwen3 base and expert checkpoints, built once; the single-node
Slurm of `make test` for the Slurm tests.

Slurm comes from ``tests/helpers/slurm.py up`` (state in ``<repo>/.ckptflow/slurm`` or
``$CKPTFLOW_TEST_SLURM``). The Slurm tests skip only where the machine cannot run Slurm (not root, or no
apt-get to install it) or where ``slurm.py up`` failed (with the one line it left, naming the reason and the
remedy); with ``CI`` set they fail instead, and a machine that could run it but where it is not up fails
with the command to start it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import servers, slurm
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


@pytest.fixture(scope="session")
def slurm_cluster() -> dict:
    root = Path(os.environ.get("CKPTFLOW_TEST_SLURM") or slurm.DEFAULT_ROOT)
    state = servers.read_state(root)
    daemons = state.get("servers", {})
    if all(name in daemons and servers.is_running(daemons[name]) for name in slurm.ORDER):
        return state
    reason = slurm.cannot_run_reason()
    if reason and not os.environ.get("CI"):
        pytest.skip(f"Slurm tests skipped: this machine cannot run Slurm ({reason})")
    failure = slurm.up_failure(root)
    if failure:
        message = f"the single-node Slurm under {root} did not start: {failure}"
        if not os.environ.get("CI"):
            pytest.skip(f"Slurm tests skipped: {message}")
        pytest.fail(message, pytrace=False)
    pytest.fail(f"the single-node Slurm is not running under {root}; start it with `make slurm-up` "
                f"(or run `make test`){f' ({reason})' if reason else ''}", pytrace=False)
