"""Streaming: merging three 256 MiB experts never holds more than about one output tensor in memory.

The merge runs as the real CLI in a child process; its anonymous RSS (``RssAnon`` in
``/proc/<pid>/status``: memory-mapped expert pages are file-backed and not counted) is sampled until it
exits. The ceiling is 2 x the largest tensor (the output tensor being computed and the one being
written) + 200 MiB (the interpreter and torch themselves). Loading the experts (768 MiB) or holding the whole output (256 MiB) breaks it.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from merge_helpers import bits_equal
from safetensors.torch import load_file, save_file

from ckptflow.merge.reader import SINGLE_NAME
from helpers import REPO
from helpers.memory import peak_rss_anon

# Memory ceilings: sampled RssAnon of a child; run apart from the other memory-heavy tests.
pytestmark = pytest.mark.alone

MiB = 1 << 20
SHAPE = (4096, 4096)  # 32 MiB in bf16
N_TENSORS = 8  # 256 MiB per expert
LARGEST = 4096 * 4096 * 2


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    gen = torch.Generator().manual_seed(0)
    names = [f"model.layers.{i}.mlp.down_proj.weight" for i in range(N_TENSORS)] + ["model.norm.weight"]

    def state(scale: float) -> dict[str, torch.Tensor]:
        sd = {n: (torch.randn(SHAPE, generator=gen) * scale).to(torch.bfloat16) for n in names[:-1]}
        sd[names[-1]] = torch.ones(4096, dtype=torch.bfloat16)
        return sd

    base = root / "base"
    base.mkdir()
    save_file(state(1.0), base / SINGLE_NAME)
    (base / "config.json").write_text(json.dumps({"model_type": "synthetic", "tie_word_embeddings": False}))
    experts = []
    for i in range(3):
        path = root / f"e{i}.pt"
        torch.save({"net": state(1.0 + i)}, path)
        assert path.stat().st_size >= 256 * MiB
        experts.append(path)
    return base, experts


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["avg", "tv"])
def test_peak_anonymous_memory_is_bounded_by_the_largest_tensor(big, tmp_path, mode):
    base, experts = big
    out = tmp_path / "iter_000001" / "model.pt"
    cmd = [sys.executable, "-m", "ckptflow", "merge", "--mode", mode, "--experts", ",".join(map(str, experts)),
           "--out", str(out)]
    if mode == "tv":
        cmd += ["--base", str(base), "--diag", str(tmp_path / "diag.json")]
    peak, proc = peak_rss_anon(cmd, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    ceiling = 2 * LARGEST + 200 * MiB
    assert 0 < peak <= ceiling, f"peak RssAnon {peak / MiB:.0f} MiB > ceiling {ceiling / MiB:.0f} MiB"
    # And the streamed output is still exact on one of the largest tensors.
    key = "model.layers.0.mlp.down_proj.weight"
    net = torch.load(out, map_location="cpu", mmap=True, weights_only=True)["net"]
    xs = [torch.load(p, map_location="cpu", mmap=True, weights_only=True)["net"][key].float() for p in experts]
    if mode == "avg":
        want = ((xs[0] + xs[1] + xs[2]) / 3).to(torch.bfloat16)
    else:
        b = load_file(base / SINGLE_NAME)[key].float()
        want = (b + ((xs[0] - b) + (xs[1] - b) + (xs[2] - b))).to(torch.bfloat16)
    assert bits_equal(net[key], want)
