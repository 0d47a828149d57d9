"""A probe of the machine, not of ckptflow: does writing memory just before a save slow the save down?

An asynchronous save copies the state into memory of its own (staging) and writes the file from that copy
at once; a synchronous save writes from memory the loop last touched a step ago. This script times the same
``torch.save`` + fsync of a ``--gib`` state in one process three ways, interleaved over ``--rounds`` rounds
(each round one way later, every other round backwards), with ``os.sync()`` after each file's removal:

- ``none``: no other memory is held;
- ``held``: a copy of the state's size is held, last written long before (a previous round);
- ``touched``: the same copy, overwritten with the state right before the save (what staging does).

For each it prints the median wall time and the process's system CPU during the save (``getrusage``). On a
machine where the three agree, an asynchronous save's time to its commit is its staging plus the
synchronous write; where ``touched`` is slower, the difference is the machine's, and every asynchronous
saver that stages pays it (``dcp.async_save`` included).

    python bench/write_after_touch.py --gib 4 --rounds 6
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchlib import round_order

GiB = 1024**3
WAYS = ("none", "held", "touched")


def save(state: dict, path: Path) -> tuple[float, float]:
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    took, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return took, after.ru_stime - before.ru_stime


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gib", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--dir", help="where to write (default: a temporary directory beside the system's)")
    p.add_argument("--credentials", help=argparse.SUPPRESS)  # make bench passes one to every benchmark
    args = p.parse_args(argv)
    layers = 8
    gen = torch.Generator().manual_seed(0)
    state = {f"layer{i}": torch.rand(int(args.gib * GiB / 4 / layers), generator=gen) for i in range(layers)}
    extra: dict | None = {k: v.clone() for k, v in state.items()}
    times: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="write-after-touch-", dir=args.dir) as tmp:
        path = Path(tmp) / "state.pt"
        for r in range(args.rounds):
            for way in round_order(list(WAYS), r):
                if way == "none":
                    extra = None
                elif extra is None:
                    extra = {k: v.clone() for k, v in state.items()}
                    time.sleep(3)  # written now, not just before the save
                if way == "touched":
                    for k, v in state.items():
                        extra[k].copy_(v)
                times[way].append(save(state, path))
                path.unlink()
                os.sync()
    print(f"write_after_touch: torch.save + fsync of {args.gib:g} GiB, {args.rounds} rounds, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M %Z')}, load average {' '.join(f'{x:.1f}' for x in load)} at the start")
    base = statistics.median(t for t, _ in times["none"])
    for way, runs in times.items():
        wall, sys_cpu = statistics.median(t for t, _ in runs), statistics.median(s for _, s in runs)
        print(f"  {way:8s} {wall:7.2f} s ({wall / base:4.2f}x none)   system CPU {sys_cpu:6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
