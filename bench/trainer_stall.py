"""The training loop's stall at a save: ckptflow's synchronous and asynchronous saves beside ``torch.save`` +
fsync, ``dcp.save`` and ``dcp.async_save``, same state, same run, several rounds, one process.

For each way of saving it prints the median over ``--rounds`` of the time the caller was blocked
(``stall``) and the time until the save was durable (``done``: committed manifest for ckptflow; the
returned future for ``dcp.async_save``), then the ratios the trainer page quotes. ``--plan model``:
the model's state only (``model.pt``; the DCP peers save the same state); ``--plan full``: the model,
an AdamW state (two moments of the model's size) and the trainer state. The rounds of the ways are
interleaved so load on a shared machine falls on all of them alike; on a busy machine the spread is
wide, so read the ratios, not the seconds.

    python bench/trainer_stall.py --gib 1 --rounds 3 --plan model
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from ckptflow.trainer import write_artifact

GiB = 1024**3


def build_state(gib: float, plan: str) -> dict:
    n = int(gib * GiB / 4)
    model = {f"layer{i}.weight": torch.randn(n // 8) for i in range(8)}
    comps: dict = {"model": model}
    if plan == "full":
        comps["optimizer"] = {"state": {k: {"step": torch.tensor(10.0), "exp_avg": torch.randn_like(v),
                                            "exp_avg_sq": torch.rand_like(v)} for k, v in model.items()},
                              "param_groups": [{"lr": 1e-3, "params": list(model)}]}
        comps["trainer_state"] = {"optimizer_step": 10}
    return comps


def fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def torch_save(comps: dict, out: Path) -> tuple[float, float]:
    start = time.perf_counter()
    out.mkdir()
    with open(out / "model.pt", "wb") as fh:
        torch.save({"net": comps["model"]}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    if "optimizer" in comps:
        dcp.save({"optim": comps["optimizer"]}, checkpoint_id=str(out / "optim"))
        with open(out / "trainer.pt", "wb") as fh:
            torch.save(comps["trainer_state"], fh)
            fh.flush()
            os.fsync(fh.fileno())
    took = time.perf_counter() - start
    return took, took


def dcp_save(comps: dict, out: Path) -> tuple[float, float]:
    start = time.perf_counter()
    dcp.save(comps, checkpoint_id=str(out))  # FileSystemWriter fsyncs its files
    took = time.perf_counter() - start
    return took, took


def dcp_async_save(comps: dict, out: Path) -> tuple[float, float]:
    start = time.perf_counter()
    future = dcp.async_save(comps, checkpoint_id=str(out))
    stall = time.perf_counter() - start
    future.result()
    return stall, time.perf_counter() - start


def ckptflow_sync(comps: dict, out: Path) -> tuple[float, float]:
    start = time.perf_counter()
    write_artifact(out, 1, comps)
    took = time.perf_counter() - start
    return took, took


def ckptflow_async(comps: dict, out: Path) -> tuple[float, float]:
    start = time.perf_counter()
    handle = write_artifact(out, 1, comps, asynchronous=True)
    stall = time.perf_counter() - start
    handle.result()
    return stall, time.perf_counter() - start


WAYS = {"torch.save+fsync": torch_save, "dcp.save": dcp_save, "dcp.async_save": dcp_async_save,
        "ckptflow sync": ckptflow_sync, "ckptflow async": ckptflow_async}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=1.0, help="the model's size in GiB (fp32)")
    p.add_argument("--plan", choices=("model", "full"), default="model")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", help="where to write (default: a temporary directory beside the system's)")
    p.add_argument("--credentials", help=argparse.SUPPRESS)  # make bench passes one to every benchmark
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    comps = build_state(args.gib, args.plan)
    root = Path(tempfile.mkdtemp(prefix="trainer-stall-", dir=args.dir))
    results: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    try:
        for r in range(args.rounds):
            for name, way in WAYS.items():
                out = root / f"{name.replace(' ', '-')}-{r}"
                results[name].append(way(comps, out))
                shutil.rmtree(out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {n: (statistics.median(s for s, _ in v), statistics.median(d for _, d in v)) for n, v in results.items()}
    print(f"trainer_stall: {args.gib:g} GiB model, plan {args.plan}, {args.rounds} rounds, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d')}")
    for name, (stall, done) in med.items():
        print(f"  {name:18s} stall {stall:7.2f} s   done {done:7.2f} s")
    base = med["torch.save+fsync"][1]
    print(f"  ckptflow sync / torch.save(+dcp.save)+fsync: {med['ckptflow sync'][1] / base:.2f}x")
    print(f"  ckptflow async stall / dcp.async_save stall: {med['ckptflow async'][0] / med['dcp.async_save'][0]:.2f}x")
    print(f"  ckptflow async done / ckptflow sync: {med['ckptflow async'][1] / med['ckptflow sync'][1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
