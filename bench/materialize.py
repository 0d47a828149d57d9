"""HF conversion: ckptflow's streaming ``convert_checkpoint`` versus the plain way, same weights, same run.

(a) baseline: ``torch.load(model.pt, weights_only=True)`` (the whole state dict in memory), the layout
    mapped to the base's on-disk form (``layout.to_on_disk``: a no-op rename for a dense model), then
    ``safetensors.torch.save_file`` per 5 GB shard + the index; no fsync;
(b) ckptflow: ``convert_checkpoint`` (memory-mapped source, shard-by-shard streaming, sidecars, index last),
    with its default fsync of every file, and (c) the same with ``fsync=False`` to show what durability costs.

Each run is a fresh child process; the page cache is warmed by reading model.pt first, and runs are
interleaved (a, b, c, a, b, c …); the median of ``--runs`` is reported. Peak memory: ``VmHWM`` (peak
resident set, memory-mapped file pages included) and the peak of ``RssAnon`` sampled every millisecond.
Both sides import torch and transformers and build the base's meta model (~350 MiB VmHWM, measured as
``import_floor``); ``vm_hwm_above_floor_ratio`` compares what each adds on top of that.
Targets: wall ≤ 1.2× and peak RSS ≤ 0.25× the baseline. Prints one JSON object on stdout.

The input model is a tiny_models qwen3 (dense, untied) or qwen3_moe scaled up with random weights:

    python bench/materialize.py                     # ~1.1 GiB dense model.pt
    python bench/materialize.py --kind qwen3_moe    # ~1.1 GiB, experts fused in model.pt, per-expert on disk
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers import tiny_models as tm  # noqa: E402 - lives in tests/helpers, shared with the test suite

MiB = 1 << 20
GiB = 1 << 30

SIZES = {
    # 22 layers x (attention 6.3M + MLP 18.9M params) ≈ 555M params ≈ 1.03 GiB bf16
    "qwen3": {
        "hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 22, "num_attention_heads": 12,
        "num_key_value_heads": 4, "head_dim": 128, "tie_word_embeddings": False,
    },
    # 15 layers x (8 experts x 3 x 1536 x 1024 + attention 3.1M) ≈ 613M params ≈ 1.14 GiB bf16
    "qwen3_moe": {
        "hidden_size": 1024, "intermediate_size": 2048, "moe_intermediate_size": 1536, "num_experts": 8,
        "num_hidden_layers": 15, "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 128,
    },
}

CHILD = r"""
import json, os, sys, threading, time
from pathlib import Path

def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024

peak, done = [status("RssAnon")], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], status("RssAnon"))
        time.sleep(0.001)
threading.Thread(target=sample, daemon=True).start()

mode, model_pt, base, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
import torch
from safetensors.torch import save_file
from ckptflow.conversion import shards
from ckptflow.conversion.hf import convert_checkpoint
from ckptflow.conversion.layout import KeyMapper, to_on_disk
from ckptflow.conversion.source import read_base

start = time.perf_counter()
if mode == "baseline":
    base_info = read_base(base)
    state = torch.load(model_pt, weights_only=True, map_location="cpu")["net"]
    state = to_on_disk(state, base_info.infos(), KeyMapper.for_base(base))
    state = {k: v.contiguous() for k, v in state.items()}
    sizes = [(k, v.numel() * v.element_size()) for k, v in state.items()]
    groups = shards.plan_shards(sizes, shards.DEFAULT_MAX_SHARD_BYTES)
    out.mkdir()
    weight_map = {}
    for i, keys in enumerate(groups, 1):
        name = shards.shard_name(i, len(groups))
        save_file({k: state[k] for k in keys}, str(out / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, name))
    shards.write_index(out, weight_map, sum(n for _, n in sizes))
elif mode == "floor":
    KeyMapper.for_base(base)  # what both sides import and build before touching a weight
else:
    convert_checkpoint(model_pt, base, out, progress=False, fsync=(mode == "ckptflow"))
wall = time.perf_counter() - start
done.set()
print(json.dumps({"wall_s": wall, "peak_rss_anon": max(peak[0], status("RssAnon")), "vm_hwm": status("VmHWM")}))
"""


def prepare(workdir: Path, kind: str, layers: int | None = None) -> tuple[Path, Path]:
    name = f"{kind}-{layers}l" if layers else kind
    base, model_pt = workdir / f"{name}-base", workdir / f"{name}-model.pt"
    stamp = workdir / f"{name}.ready"
    if not stamp.exists():
        shutil.rmtree(base, ignore_errors=True)
        t0 = time.perf_counter()
        overrides = dict(SIZES[kind], **({"num_hidden_layers": layers} if layers else {}))
        tm.build_tiny_base(kind, base, overrides=overrides)
        state = tm.perturbed(tm.in_memory_state_dict(base), scale=0.01, seed=7)
        tm.save_consolidated(state, model_pt)
        del state
        stamp.write_text("ok\n")
        print(f"built {kind} input in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return base, model_pt


def warm(path: Path) -> None:
    with open(path, "rb") as fh:
        while fh.read(64 * MiB):
            pass


def run(mode: str, model_pt: Path, base: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(model_pt), str(base), str(out)],
        capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{proc.stderr[-3000:]}")
    shutil.rmtree(out, ignore_errors=True)
    return json.loads(proc.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=sorted(SIZES), default="qwen3")
    ap.add_argument("--layers", type=int, default=None, help="override num_hidden_layers to scale the model")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default=str(ROOT / ".ckptflow" / "bench-materialize"))
    args = ap.parse_args()

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    base, model_pt = prepare(workdir, args.kind, args.layers)
    warm(model_pt)
    modes = ("baseline", "ckptflow", "ckptflow_nofsync")
    results: dict[str, list[dict]] = {m: [] for m in (*modes, "floor")}
    for _ in range(args.runs):
        for mode in (*modes, "floor"):
            results[mode].append(run(mode, model_pt, base, workdir / "out"))

    def med(mode: str, field: str) -> float:
        return statistics.median(r[field] for r in results[mode])

    report = {
        "kind": args.kind,
        "model_pt_gib": round(model_pt.stat().st_size / GiB, 3),
        "runs": args.runs,
        **{
            mode: {
                "wall_s": round(med(mode, "wall_s"), 2),
                "vm_hwm_mib": round(med(mode, "vm_hwm") / MiB),
                "peak_rss_anon_mib": round(med(mode, "peak_rss_anon") / MiB),
            }
            for mode in modes
        },
    }
    floor = med("floor", "vm_hwm")
    report["import_floor_vm_hwm_mib"] = round(floor / MiB)
    for mode in modes[1:]:
        report[f"{mode}_vs_baseline"] = {
            "wall_ratio": round(med(mode, "wall_s") / med("baseline", "wall_s"), 3),
            "vm_hwm_ratio": round(med(mode, "vm_hwm") / med("baseline", "vm_hwm"), 3),
            "rss_anon_ratio": round(med(mode, "peak_rss_anon") / med("baseline", "peak_rss_anon"), 3),
            # above the floor both pay (torch + transformers + the meta model): what the conversion adds
            "vm_hwm_above_floor_ratio": round((med(mode, "vm_hwm") - floor) / (med("baseline", "vm_hwm") - floor), 3),
        }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
