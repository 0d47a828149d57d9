"""Streaming: converting a model.pt with ≥ 256 MiB of weights keeps anonymous memory ≤ 2 × largest tensor + 300 MiB.

The conversion runs in a child process that samples its own ``RssAnon`` (``/proc/self/status``) every
millisecond: VmHWM would count the memory-mapped checkpoint pages, which are page cache, not a cost.
The figure includes importing torch and transformers.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ckptflow.conversion.verify import verify_output
from helpers import tiny_models as tm

# Memory ceilings: sampled RssAnon of a child; run apart from the other memory-heavy tests.
pytestmark = pytest.mark.alone

MiB = 1 << 20

CHILD = r"""
import json, sys, threading, time
from pathlib import Path

def rss_anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024

peak, done = [rss_anon()], threading.Event()

def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss_anon())
        time.sleep(0.001)

threading.Thread(target=sample, daemon=True).start()
from ckptflow.conversion.hf import convert_checkpoint
result = convert_checkpoint(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), progress=False)
done.set()
peak[0] = max(peak[0], rss_anon())
print(json.dumps({"peak_rss_anon": peak[0], "total_size": result.total_size}))
"""

# qwen3_moe with 8 layers of 16 experts: ~300 MiB of bf16 weights, largest tensor a fused gate_up of 24 MiB.
LARGE = {
    "hidden_size": 512, "intermediate_size": 1024, "moe_intermediate_size": 768, "num_experts": 16,
    "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
}


@pytest.mark.slow
def test_peak_anonymous_memory_stays_under_twice_the_largest_tensor_plus_300_mib(tmp_path):
    base = tm.build_tiny_base("qwen3_moe", tmp_path / "base", overrides=LARGE)
    state = tm.perturbed(tm.in_memory_state_dict(base), scale=0.01, seed=3)
    largest = max(t.numel() * t.element_size() for t in state.values())
    total = sum(t.numel() * t.element_size() for t in state.values())
    model_pt = tm.save_consolidated(state, tmp_path / "model.pt")
    del state
    assert total >= 256 * MiB

    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(model_pt), str(base), str(tmp_path / "out")],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    ceiling = 2 * largest + 300 * MiB
    assert report["peak_rss_anon"] <= ceiling, (
        f"peak RssAnon {report['peak_rss_anon'] / MiB:.0f} MiB > {ceiling / MiB:.0f} MiB "
        f"(largest tensor {largest / MiB:.0f} MiB, weights {total / MiB:.0f} MiB)"
    )
    summary = verify_output(tmp_path / "out", base, model_pt, min_tensors=0)
    assert summary.total_size == report["total_size"] and "expert_layout" in summary.checks
