"""Expert merge: ckptflow versus a torch.load baseline and (optionally) mergekit, same experts, same run.

Builds a Qwen3 base of about ``--size-gib`` (random init, bf16) and three experts = base + noise, each
written as a consolidated ``model.pt`` (ckptflow, baseline) and as a Hugging Face directory (mergekit).
Then, for ``avg`` and ``tv`` (lam 1.0), each tool runs in its own process:

* ckptflow: ``python -m ckptflow merge`` (hashes the experts, streams, verifies, commits);
* baseline: ``torch.load`` every expert whole, fp32 sums, ``torch.save`` (what a short script does);
* mergekit (with ``--mergekit-python``, a separate venv): ``linear`` / ``task_arithmetic`` with
  ``dtype: float32, out_dtype: bfloat16``.

Each process's wall time (median of ``--runs``; the machine may be shared, so CPU seconds are given too), peak RSS (``VmHWM``, mapped file pages included) and peak anonymous RSS
(``RssAnon``), both sampled every 5 ms, are printed with the ratios to ckptflow, and every tool's output
tensors are compared bit for bit with ckptflow's. Prints one JSON object on stdout.

    python bench/merge.py [--size-gib 1.0] [--runs 3] [--mergekit-python /tmp/mk/bin/python] [--workdir DIR]

mergekit lives in its own venv; it installs only with torch pinned in the same command:
``python -m venv /tmp/mk && /tmp/mk/bin/pip install torch==2.13.0 mergekit``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20

BASELINE = textwrap.dedent("""
    import sys, torch
    mode, out, base, *experts = sys.argv[1:]
    sds = [torch.load(p, map_location="cpu", weights_only=True)["net"] for p in experts]
    b = None
    if mode == "tv":
        from safetensors.torch import load_file
        import json, pathlib
        idx = json.loads((pathlib.Path(base) / "model.safetensors.index.json").read_text())["weight_map"]
        b = {}
        for shard in sorted(set(idx.values())):
            b.update(load_file(pathlib.Path(base) / shard))
    merged = {}
    for k in sds[0]:
        if mode == "avg":
            total = sds[0][k].float()
            for sd in sds[1:]:
                total = total + sd[k].float()
            merged[k] = (total / len(sds)).to(sds[0][k].dtype)
        else:
            bk = b[k].float()
            total = sds[0][k].float() - bk
            for sd in sds[1:]:
                total = total + (sd[k].float() - bk)
            merged[k] = (bk + total).to(sds[0][k].dtype)
    torch.save({"net": merged}, out)
""")


def _qwen3_overrides(size_gib: float) -> dict:
    hidden, inter = 2048, 6144
    per_layer = 2 * (2 * hidden * hidden + 2 * hidden * (hidden // 2) + 3 * hidden * inter)
    layers = max(1, round(size_gib * (1 << 30) / per_layer + 0.5))
    return {"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": 16,
            "num_key_value_heads": 8, "head_dim": 128, "tie_word_embeddings": False}


def build_inputs(work: Path, size_gib: float) -> tuple[Path, list[Path], list[Path]]:
    sys.path.insert(0, str(REPO / "tests"))
    from helpers.tiny_models import build_tiny_base, perturbed

    base = work / "base"
    if not (base / "config.json").exists():
        shutil.rmtree(base, ignore_errors=True)
        build_tiny_base("qwen3", base, overrides=_qwen3_overrides(size_gib))
        # One shard per ~1 GiB is closer to a real checkpoint than the builder's 100 KB shards.
        sd = _read_hf(base)
        for f in base.glob("model*.safetensors*"):
            f.unlink()
        _write_hf(sd, base)
    base_sd = _read_hf(base)
    pts, dirs = [], []
    for i in range(3):
        pt, hf = work / f"expert{i}" / "model.pt", work / f"expert{i}_hf"
        if not pt.exists() or not (hf / "config.json").exists():
            sd = perturbed(base_sd, 0.01, seed=i + 1)
            pt.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"net": sd}, pt)
            hf.mkdir(exist_ok=True)
            _write_hf(sd, hf)
            shutil.copy(base / "config.json", hf / "config.json")
        pts.append(pt)
        dirs.append(hf)
    return base, pts, dirs


def _read_hf(directory: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def _write_hf(sd: dict[str, torch.Tensor], directory: Path) -> None:
    save_file({k: v.contiguous() for k, v in sd.items()}, directory / "model.safetensors")
    (directory / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": dict.fromkeys(sd, "model.safetensors")}))


def measure(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``: wall time and peak VmHWM / RssAnon of that process (sampled every 5 ms)."""
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "CKPTFLOW_PROGRESS": "0", **(env or {})})
    peak = {"RssAnon:": 0, "VmHWM:": 0}
    done = threading.Event()

    def sample() -> None:
        # VmHWM is reset by exec, unlike ru_maxrss, which also counts the forked copy of this process.
        while not done.is_set():
            try:
                with open(f"/proc/{proc.pid}/status") as fh:
                    for line in fh:
                        key = line.split(maxsplit=1)[0]
                        if key in peak:
                            peak[key] = max(peak[key], int(line.split()[1]) * 1024)
            except OSError:
                return
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err_bytes = proc.communicate()
    wall = time.perf_counter() - start
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the child was reaped by communicate()
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    done.set()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[:4]} failed ({proc.returncode}): {err_bytes.decode()[-2000:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_mib": round(peak["VmHWM:"] / MiB),
            "peak_rss_anon_mib": round(peak["RssAnon:"] / MiB)}


def _mergekit_config(mode: str, base: Path, dirs: list[Path]) -> str:
    lines = [f"merge_method: {'linear' if mode == 'avg' else 'task_arithmetic'}"]
    if mode == "tv":
        lines.append(f"base_model: {base}")
    lines.append("models:")
    for d in dirs:
        lines += [f"  - model: {d}", "    parameters:", "      weight: 1.0"]
    lines += ["parameters:", f"  normalize: {'true' if mode == 'avg' else 'false'}", "dtype: float32",
              "out_dtype: bfloat16"]
    return "\n".join(lines) + "\n"


def compare(reference: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> bool:
    if sorted(reference) != sorted(other):
        return False
    return all(
        reference[k].dtype == other[k].dtype and torch.equal(reference[k].view(torch.int16), other[k].view(torch.int16))
        for k in reference
    )


def _tools(mode: str, runs_dir: Path, base: Path, pts: list[Path], dirs: list[Path], mergekit: str | None):
    """(name, command, env, output reader) for each tool; each run writes into a fresh directory."""
    out = runs_dir / "ckptflow" / "iter_000001" / "model.pt"
    cmd = [sys.executable, "-m", "ckptflow", "merge", "--mode", mode, "--experts", ",".join(map(str, pts)),
           "--out", str(out)]
    if mode == "tv":
        cmd += ["--base", str(base), "--lam", "1.0"]
    plain = runs_dir / "baseline.pt"
    tools = [
        ("ckptflow", cmd, None, lambda: torch.load(out, map_location="cpu", mmap=True, weights_only=True)["net"]),
        ("torch_load_baseline", [sys.executable, "-c", BASELINE, mode, str(plain), str(base), *map(str, pts)], None,
         lambda: torch.load(plain, map_location="cpu", mmap=True, weights_only=True)["net"]),
    ]
    if mergekit:
        cfg = runs_dir / "mergekit.yml"
        mk_out = runs_dir / "mergekit"
        tools.append(("mergekit", [mergekit, "-m", "mergekit.scripts.run_yaml", str(cfg), str(mk_out)],
                      {"CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}, lambda: _read_hf(mk_out)))
        cfg.parent.mkdir(parents=True, exist_ok=True)
        cfg.write_text(_mergekit_config(mode, base, dirs))
    return tools


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=1.0, help="approximate size of the model (default 1.0)")
    ap.add_argument("--workdir", default=None, help="inputs are kept here between runs (default: a temp dir)")
    ap.add_argument("--mergekit-python", default=None, help="python of a venv with mergekit installed")
    ap.add_argument("--modes", default="avg,tv")
    ap.add_argument("--runs", type=int, default=3, help="interleaved runs per tool; the median time is reported")
    args = ap.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="ckptflow-bench-merge-"))
    work.mkdir(parents=True, exist_ok=True)
    base, pts, dirs = build_inputs(work, args.size_gib)
    results: dict = {"model_bytes": pts[0].stat().st_size, "experts": 3, "runs": args.runs, "modes": {}}
    for mode in args.modes.split(","):
        runs_dir = work / f"runs-{mode}"
        samples: dict[str, list[dict]] = {}
        identical: dict[str, bool] = {}
        for _ in range(args.runs):  # tools interleaved, so machine noise hits all of them alike
            shutil.rmtree(runs_dir, ignore_errors=True)
            tools = _tools(mode, runs_dir, base, pts, dirs, args.mergekit_python)
            outputs = {}
            for name, cmd, env, read in tools:
                samples.setdefault(name, []).append(measure(cmd, env))
                outputs[name] = read()
            for name, merged in outputs.items():
                identical[name] = identical.get(name, True) and compare(outputs["ckptflow"], merged)
        row = {
            name: {
                "wall_s": statistics.median(r["wall_s"] for r in rs),
                "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in rs),
                "peak_rss_anon_mib": max(r["peak_rss_anon_mib"] for r in rs),
                "identical_to_ckptflow": identical[name],
            }
            for name, rs in samples.items()
        }
        ours = row["ckptflow"]
        for name, r in row.items():
            if name != "ckptflow":
                r["ckptflow_time_ratio"] = round(ours["wall_s"] / r["wall_s"], 3)
                r["ckptflow_cpu_ratio"] = round(ours["cpu_s"] / r["cpu_s"], 3)
                r["ckptflow_peak_rss_ratio"] = round(ours["peak_rss_mib"] / max(1, r["peak_rss_mib"]), 3)
                r["ckptflow_peak_rss_anon_ratio"] = round(ours["peak_rss_anon_mib"] / max(1, r["peak_rss_anon_mib"]), 3)
        results["modes"][mode] = row
        shutil.rmtree(runs_dir, ignore_errors=True)
    print(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
