"""The training loop's stall at a save: ckptflow's synchronous and asynchronous saves beside ``torch.save`` +
fsync, ``dcp.save`` and ``dcp.async_save``, same state, same run, several rounds, one process or two ranks.

For each way of saving it prints the median over ``--rounds`` of the time the caller was blocked
(``stall``) and the time until the save was durable (``done``: committed manifest for ckptflow; the
returned future for ``dcp.async_save``), the peak extra anonymous memory of a save (``peak RSS``: RssAnon
read from ``/proc/self/status`` every few milliseconds during two saves, above the process's RssAnon before
them, measured in a fresh process per way so that no way inherits another's freed memory; beside it the
staged state's size, the CPU copy an asynchronous save makes), then the four goal ratios of the trainer page:
ckptflow async stall / dcp.async_save stall, ckptflow sync / torch.save (+ dcp.save) + fsync, ckptflow async
done / ckptflow sync, and ckptflow async peak RSS / staged state. The rounds of the ways are interleaved so
load on a shared machine falls on all of them alike; on a busy machine the spread is wide, so read the
ratios, not the seconds (the load average is printed with them).

``--gib`` is the size of the saved state. ``--plan model``: the model's state only (``model.pt``; the DCP
peers save the same state); ``--plan full``: a model of a third of it, an AdamW state (two moments of the
model's size) and the trainer state. Sizes are chosen so a run fits 24 GiB of RAM: the state, its staged
copy (up to the state's size again) and the page cache of the files being written; a 4 GiB model's full
plan (12 GiB) plus its 12 GiB staged copy does not fit, hence 4 GiB of state. ``--ranks 2`` reruns the script
under ``torchrun --nproc-per-node 2`` (gloo, CPU): every rank holds the model (data parallel) and half of the
optimizer moments (under names of its own); ckptflow saves with its two-rank plan (rank 0 writes ``model.pt``
and ``trainer.pt``, every rank its DCP shards of ``optim/``), ``torch.save`` + fsync likewise (``torch.save``
on rank 0, ``dcp.save`` of the optimizer on both), ``dcp.save`` / ``dcp.async_save`` the whole state on both;
times are the slower rank's, peak RSS the larger rank's, the staged state rank 0's (the model and its half).
Two ranks hold the state twice, so they run 1 GiB.

    python bench/trainer_stall.py                      # the suite make bench runs (below)
    python bench/trainer_stall.py --gib 1 --plan model --rounds 3
    python bench/trainer_stall.py --gib 4 --plan full --rounds 3
    python bench/trainer_stall.py --gib 1 --plan full --ranks 2 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from benchlib import round_order
from ckptflow.trainer import write_artifact

GiB = 1024**3
SUITE = [("1", "model", 1), ("1", "full", 1), ("4", "model", 1), ("4", "full", 1), ("1", "model", 2),
         ("1", "full", 2)]


def build_state(gib: float, plan: str, rank: int = 0, world: int = 1) -> dict:
    """The components: model-plan ``gib`` of model; full plan a third of it in the model and two thirds in
    AdamW moments, of which this rank holds its ``1/world`` (every ``world``-th layer, under its own names)."""
    layers = 8
    model_bytes = gib * GiB / (3 if plan == "full" else 1)
    n = int(model_bytes / 4 / layers)
    gen = torch.Generator().manual_seed(0)  # every rank the same model
    model = {f"layer{i}.weight": torch.rand(n, generator=gen) for i in range(layers)}
    comps: dict = {"model": model}
    if plan == "full":
        mine = [k for i, k in enumerate(model) if i % world == rank]
        comps["optimizer"] = {"state": {k: {"step": torch.tensor(10.0), "exp_avg": torch.rand(n),
                                            "exp_avg_sq": torch.rand(n)} for k in mine},
                              "param_groups": [{"lr": 1e-3, "params": mine}]}
        comps["trainer_state"] = {"optimizer_step": 10}
    return comps


def state_bytes(obj) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.untyped_storage().nbytes()
    if isinstance(obj, dict):
        return sum(state_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(state_bytes(v) for v in obj)
    return 0


def staged_bytes(comps: dict, rank: int) -> int:
    """What an asynchronous ckptflow save stages on this rank: the model on rank 0, its own optimizer state."""
    return (state_bytes(comps["model"]) if rank == 0 else 0) + state_bytes(comps.get("optimizer", {}))


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def torch_save(comps: dict, out: Path) -> tuple[float, float]:
    start = time.perf_counter()
    if _rank() == 0:
        out.mkdir(exist_ok=True)
        with open(out / "model.pt", "wb") as fh:
            torch.save({"net": comps["model"]}, fh)
            fh.flush()
            os.fsync(fh.fileno())
    if "optimizer" in comps:
        dcp.save({"optim": comps["optimizer"]}, checkpoint_id=str(out / "optim"))
        if _rank() == 0:
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


def rss_anon() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


class PeakRss:
    """The largest RssAnon seen (every 2 ms) while the block runs."""

    def __enter__(self) -> PeakRss:
        self.peak = rss_anon()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, rss_anon())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_anon())


def _shared_dir(parent: str | None) -> Path:
    """A temporary directory every rank writes under (rank 0 makes it)."""
    path = [tempfile.mkdtemp(prefix="trainer-stall-", dir=parent) if _rank() == 0 else None]
    if dist.is_initialized():
        dist.broadcast_object_list(path, src=0)
    return Path(path[0])


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _slowest(values: list[float], op=None) -> list[float]:
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op or dist.ReduceOp.MAX)
    return t.tolist()


def run_times(args) -> dict[str, list[tuple[float, float]]]:
    """Every way ``args.rounds`` times, interleaved, in this process (on every rank)."""
    comps = build_state(args.gib, args.plan, _rank(), args.world)
    root = _shared_dir(args.dir)
    results: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    try:
        for r in range(args.rounds):
            for name in round_order(list(WAYS), r):
                way = WAYS[name]
                out = root / f"{name.replace(' ', '-')}-{r}"
                _barrier()
                stall, done = _slowest(list(way(comps, out)))
                results[name].append((stall, done))
                _barrier()
                if _rank() == 0:
                    shutil.rmtree(out)
                    os.sync()  # the removal's journal commit and discards land here, not in the next way's time
    finally:
        _barrier()
        if _rank() == 0:
            shutil.rmtree(root, ignore_errors=True)
    return results


def run_rss(args) -> dict[str, float]:
    """One way, two saves, in this fresh process: its peak RssAnon above the RssAnon before them."""
    comps = build_state(args.gib, args.plan, _rank(), args.world)
    root = _shared_dir(args.dir)
    way = WAYS[args.rss_of]
    try:
        _barrier()
        base = rss_anon()
        with PeakRss() as peak:
            for r in range(2):
                out = root / f"rss-{r}"
                _barrier()
                way(comps, out)
                _barrier()
                if _rank() == 0:
                    shutil.rmtree(out)
    finally:
        _barrier()
        if _rank() == 0:
            shutil.rmtree(root, ignore_errors=True)
    extra, staged = _slowest([float(peak.peak - base), float(staged_bytes(comps, _rank()))])
    return {"extra": extra, "staged": float(staged_bytes(comps, 0)), "staged_max": staged}


def _child_argv(args, extra: list[str]) -> list[str]:
    own = [sys.executable, __file__, "--gib", str(args.gib), "--plan", args.plan, "--rounds", str(args.rounds),
           *(["--dir", args.dir] if args.dir else [])]
    if args.ranks > 1:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(args.ranks)]
        return [*torchrun, *own[1:], "--worker", *extra]
    return [*own, "--worker", *extra]


def _child(args, extra: list[str]) -> dict:
    proc = subprocess.run(_child_argv(args, extra), capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise SystemExit(f"trainer_stall: a child run failed ({proc.returncode}): {' '.join(extra)}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1])


def report(args, times: dict[str, list[list[float]]], rss: dict[str, dict[str, float]], load: tuple) -> None:
    med = {n: (statistics.median(s for s, _ in v), statistics.median(d for _, d in v)) for n, v in times.items()}
    where = "one process" if args.ranks == 1 else f"{args.ranks} ranks (torchrun, gloo, CPU)"
    print(f"trainer_stall: {args.gib:g} GiB state, plan {args.plan}, {where}, {args.rounds} rounds, "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M %Z')}, load average (1, 5, 15 min) "
          f"{' '.join(f'{x:.1f}' for x in load)} at the start, {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end")
    staged = next(iter(rss.values()))["staged"] if rss else 0.0
    for name, (stall, done) in med.items():
        extra = rss.get(name, {}).get("extra")
        mem = "" if extra is None else f"   peak RSS +{extra / GiB:5.2f} GiB ({extra / staged:4.2f}x staged)"
        print(f"  {name:18s} stall {stall:7.2f} s   done {done:7.2f} s{mem}")
    if staged:
        print(f"  staged state (rank 0): {staged / GiB:.2f} GiB")
    base = med["torch.save+fsync"][1]
    print(f"  goal ckptflow async stall / dcp.async_save stall (<= 1.5): "
          f"{med['ckptflow async'][0] / med['dcp.async_save'][0]:.2f}x")
    print(f"  goal ckptflow sync / torch.save{'(+dcp.save)' if args.plan == 'full' else ''}+fsync (<= 1.15): "
          f"{med['ckptflow sync'][1] / base:.2f}x")
    rounds = list(zip(times["ckptflow async"], times["ckptflow sync"], strict=True))  # ((stall, done), (_, done))
    paired = statistics.median(a / s for (_, a), (_, s) in rounds)
    print(f"  goal ckptflow async done / ckptflow sync (<= 1.2): {med['ckptflow async'][1] / med['ckptflow sync'][1]:.2f}x"
          f" (median of the rounds' own ratios: {paired:.2f}x)")
    # An asynchronous save's time to its commit is its staging copy (the stall) and then its background
    # write: the write beside the synchronous save of the same round says what the copy adds and what the
    # write itself costs; dcp.async_save's done beside dcp.save's is the peer's own figure of the same.
    write = statistics.median((a - st) / s for (st, a), (_, s) in rounds)
    copy = statistics.median(st / s for (st, _), (_, s) in rounds)
    peer = statistics.median(a / s for (_, a), (_, s) in zip(times["dcp.async_save"], times["dcp.save"], strict=True))
    print(f"  where ckptflow async done goes (medians of the rounds' own ratios to ckptflow sync): staging copy "
          f"{copy:.2f}x, background write {write:.2f}x; dcp.async_save done / dcp.save {peer:.2f}x")
    if "ckptflow async" in rss:
        print(f"  goal ckptflow async peak extra RSS / staged state (<= 1.1): "
              f"{rss['ckptflow async']['extra'] / staged:.2f}x")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, help="the saved state's size in GiB (fp32); without it: the suite")
    p.add_argument("--plan", choices=("model", "full"), default="model")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ranks", type=int, choices=(1, 2), default=1)
    p.add_argument("--no-rss", action="store_true", help="skip the peak RSS runs (a fresh process per way)")
    p.add_argument("--dir", help="where to write (default: a temporary directory beside the system's)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rss-of", choices=tuple(WAYS), help=argparse.SUPPRESS)
    p.add_argument("--credentials", help=argparse.SUPPRESS)  # make bench passes one to every benchmark
    args = p.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
    if args.gib is None:
        for gib, plan, ranks in SUITE:
            main(["--gib", gib, "--plan", plan, "--ranks", str(ranks), "--rounds", str(args.rounds),
                  *(["--dir", args.dir] if args.dir else []), *(["--no-rss"] if args.no_rss else [])])
        return 0
    if args.worker:
        if "RANK" in os.environ:
            dist.init_process_group("gloo")
        args.world = dist.get_world_size() if dist.is_initialized() else 1
        try:
            out = run_rss(args) if args.rss_of else {n: v for n, v in run_times(args).items()}
            if _rank() == 0:
                print(json.dumps(out), flush=True)
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
        return 0
    load = os.getloadavg()
    times = _child(args, [])
    rss = {} if args.no_rss else {name: _child(args, ["--rss-of", name]) for name in WAYS}
    report(args, times, rss, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
