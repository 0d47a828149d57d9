"""Dry-run cost at scale: ``snakemake -n publish_all`` over 1,000 committed artifacts versus a trivial one-rule
Snakefile's dry-run, and ``ckptflow status`` over the same tree (where this checkout has the verb).

The tree: one artifact sealed for real, then 999 more directories holding the same tiny payloads and a
manifest written with ``ckptflow.records.manifest`` for their own iteration (sealing each would hash
every payload again; the dry-run reads only which manifests exist). Every figure is a whole process
(interpreter start-up included), the median of 3 runs; neither command may contact the object store
(the destination is a ``file://`` path that does not exist). Target: ratio ≤ 2.

A third figure is Snakemake's own floor: a one-rule Snakefile with the same number of jobs, each with an
existing input, an output, a log and a ``script:`` (what a publish job declares), and no code of ours.
``ratio_to_floor`` says what the workflow adds over what Snakemake spends on that many jobs anyway.

    python bench/dryrun.py [--artifacts 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ckptflow.artifact import ComponentSpec, seal_artifact
from ckptflow.records.manifest import read_manifest, write_manifest

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
RUN = "proj/grp/run1/20261129T000000Z"
TRIVIAL = 'rule all:\n    output:\n        "done.txt",\n    shell:\n        "touch {output}"\n'
FLOOR = """rule all:
    input:
        expand("out/{{i}}.txt", i=range({count})),


rule one:
    input:
        "in/{{i}}.txt",
    output:
        "out/{{i}}.txt",
    log:
        "logs/{{i}}.log",
    script:
        "step.py"
"""


def build_tree(runs: Path, count: int) -> None:
    arts = runs / RUN / "checkpoint_artifacts"
    first = arts / "iter_000001"
    (first / "optim").mkdir(parents=True)
    (first / "model.pt").write_bytes(os.urandom(1024))
    (first / "optim" / ".metadata").write_bytes(os.urandom(128))
    (first / "optim" / "__0_0.distcp").write_bytes(os.urandom(512))
    seal_artifact(first, 1, [ComponentSpec("model", "model.pt"), ComponentSpec("optim", "optim")], progress=False)
    manifest = read_manifest(first)
    for i in range(2, count + 1):
        art = arts / f"iter_{i:06d}"
        shutil.copytree(first, art, ignore=shutil.ignore_patterns(".posttrain-checkpoint-artifact.json"))
        write_manifest(art, dataclasses.replace(manifest, iteration=i))


def timed(cmd: list[str], cwd: Path, runs: int) -> tuple[float, subprocess.CompletedProcess]:
    times, done = [], None
    for _ in range(runs):
        t = time.perf_counter()
        done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
        times.append(time.perf_counter() - t)
        if done.returncode != 0:
            raise SystemExit(f"`{' '.join(cmd)}` failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return statistics.median(times), done


def snakemake_floor(where: Path, count: int, runs: int) -> float:
    """Dry-run time of a one-rule Snakefile with ``count`` pending script jobs (no code of ours)."""
    (where / "in").mkdir(parents=True)
    for i in range(count):
        (where / "in" / f"{i}.txt").touch()
    (where / "step.py").touch()
    (where / "Snakefile").write_text(FLOOR.format(count=count))
    seconds, _ = timed([str(SNAKEMAKE), "--cores", "1", "-n"], where, runs)
    return seconds


def has_status_verb() -> bool:
    done = subprocess.run([sys.executable, "-m", "ckptflow", "status", "--help"], capture_output=True, text=True)
    return done.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckptflow-dryrun-") as tmp:
        work = Path(tmp)
        runs = work / "runs"
        build_tree(runs, args.artifacts)
        config = [f"runs_root={runs}", f"bucket=file://{work}/no-such-archive", f"reports_dir={work}/reports",
                  f"logs_dir={work}/logs"]
        workflow, done = timed([str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(work), "--configfile",
                                str(REPO / "config" / "config.yaml"), "--cores", "1", "-n", "publish_all",
                                "--config", *config], REPO, args.runs)
        pending = done.stdout.count("rule publish:")
        if pending != args.artifacts:
            raise SystemExit(f"the dry-run listed {pending} publish jobs, expected {args.artifacts}")
        trivial_dir = work / "trivial"
        trivial_dir.mkdir()
        (trivial_dir / "Snakefile").write_text(TRIVIAL)
        trivial, _ = timed([str(SNAKEMAKE), "--cores", "1", "-n"], trivial_dir, args.runs)
        floor = snakemake_floor(work / "floor", args.artifacts, args.runs)
        result = {"artifacts": args.artifacts, "runs": args.runs, "dryrun_publish_all_s": round(workflow, 2),
                  "dryrun_trivial_s": round(trivial, 2), "ratio": round(workflow / trivial, 2),
                  "dryrun_floor_s": round(floor, 2), "floor_ratio": round(floor / trivial, 2),
                  "ratio_to_floor": round(workflow / floor, 2)}
        if has_status_verb():
            status, _ = timed([sys.executable, "-m", "ckptflow", "status", str(runs), "--json"], REPO, args.runs)
            result["status_s"] = round(status, 2)
        else:
            result["status_s"] = None
            result["note"] = "`ckptflow status` is not in this checkout; its time is not measured"
        print(json.dumps(result, indent=2))
        if not work.joinpath("no-such-archive").exists():
            return 0
        raise SystemExit("a dry-run created the archive directory: it contacted the store")


if __name__ == "__main__":
    sys.exit(main())
