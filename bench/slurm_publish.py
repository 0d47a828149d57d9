"""Where the time of ``publish_all`` (and ``prune_all``) goes for many small artifacts: Slurm and local.

Each mode publishes its own fresh copy of the same tree (``--artifacts`` committed artifacts of a few KB,
built as bench/dryrun.py builds them) to its own ``file://`` archive, as a whole ``snakemake`` process:
``grouped``, ``--profile profiles/slurm`` (batch jobs: many artifacts per Slurm job), and ``local``,
``profiles/default`` (``cores: 2``); ``--targets publish_all,prune_all`` then prunes the same tree (verify
and prune jobs), timed on its own. The Slurm mode layers the test cluster's site profile (its account and
partition, tests/helpers/slurm.py) over the tracked one, as a user layers theirs. It needs the single-node
Slurm (``make slurm-up``); one run per mode and target (it is long).

Per mode and target it reports the wall time; the time to the first ``sbatch``; the Slurm commands the
submit host sent (``sbatch`` submissions, ``squeue``/``sacct`` status queries, every Slurm command: counts,
mean rate and the most in one second), counted by shims of the Slurm client commands first on ``PATH``; the controller's own
count of the RPCs it served in that time (``sdiag``, every client and the node's daemon together) and
their mean rate; each Slurm job's wait in the queue and its run time (``sacct`` Submit, Start, End); and
the time of each artifact inside a job (the ``finished in`` line of each rule job's log, else the job
step's ``sacct`` elapsed time). It prints a table on stderr and one JSON object on stdout.

    python bench/slurm_publish.py [--artifacts 100] [--modes grouped,local]
                                  [--targets publish_all[,prune_all]]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime
from pathlib import Path

from dryrun import REPO, SNAKEMAKE, build_tree

sys.path.insert(0, str(REPO / "tests"))
from helpers import slurm  # lives in tests/helpers: the test cluster's account and partition

CLIENTS = ("sbatch", "squeue", "sacct", "scancel", "scontrol", "sinfo", "srun", "sacctmgr")
STATUS_QUERIES = ("squeue", "sacct")
FINISHED = re.compile(r"^finished in ([0-9.]+) s$", re.M)


def client_shims(into: Path, calls: Path) -> Path:
    """A directory of shims, one per Slurm client command: each appends ``<epoch> <command> <job or submit>``
    to ``calls`` and runs the real command (the plugin runs them through the shell, so ``PATH`` decides)."""
    into.mkdir(parents=True)
    for name in CLIENTS:
        real = shutil.which(name)
        if real is None:
            continue
        shim = into / name
        shim.write_text(f'#!/bin/sh\necho "$(date +%s.%N) {name} ${{SLURM_JOB_ID:-submit}}" >> {calls}\n'
                        f'exec {real} "$@"\n')
        shim.chmod(0o755)
    return into


def controller_rpcs() -> int:
    """The RPCs slurmctld has served since its start, all message types (``sdiag``)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    section = out.split("by message type", 1)[1].split("by user", 1)[0]
    return sum(int(n) for n in re.findall(r"count:(\d+)", section))


def sacct_times(job_ids: list[str]) -> tuple[list[float], list[float], list[float]]:
    """(queue wait of each job, run time of each job, elapsed of each job step that ran a rule job), seconds."""
    if not job_ids:
        return [], [], []
    fmt = "%Y-%m-%dT%H:%M:%S"
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", "JobID,Submit,Start,End", "-j", ",".join(job_ids)],
                         capture_output=True, text=True, check=True).stdout
    waits, runs = [], []
    for line in out.splitlines():
        _, submit, start, end = line.split("|")
        s, b, e = (datetime.strptime(v, fmt) for v in (submit, start, end))
        waits.append((b - s).total_seconds())
        runs.append((e - b).total_seconds())
    out = subprocess.run(["sacct", "-n", "-P", "-o", "JobID,ElapsedRaw", "-j", ",".join(job_ids)],
                         capture_output=True, text=True, check=True).stdout
    steps = [float(raw) for job, raw in (line.split("|") for line in out.splitlines())
             if re.fullmatch(r"\d+\.\d+", job)]
    return waits, runs, steps


def busiest(times: list[float]) -> int:
    """The most of ``times`` that fall in one second (of the epoch)."""
    counts = Counter(int(t) for t in times).most_common(1)
    return counts[0][1] if counts else 0


def summary(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"n": len(values), "median": round(statistics.median(values), 2), "max": round(max(values), 2)}


def run_target(work: Path, target: str, profiles: list[str], shims: Path | None) -> dict:
    runs, archive = work / "runs", work / "archive"
    cmd = ["timeout", "-k", "10", "3600", str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(work),
           "--configfile", str(REPO / "config" / "config.yaml"), *profiles, target,
           "--config", f"runs_root={runs}", f"bucket=file://{archive}", f"reports_dir={work}/reports",
           f"logs_dir={work}/logs/{target}"]
    calls = work / f"slurm-calls-{target}.txt"
    env = dict(os.environ)
    if shims is not None:
        env["PATH"] = f"{client_shims(work / f'shims-{target}', calls)}:{env['PATH']}"
    rpcs = controller_rpcs() if shims is not None else 0
    t0 = time.time()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.time() - t0
    (work / f"snakemake-{target}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{target} with {profiles} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    result: dict = {"wall_s": round(wall, 1)}
    per_artifact = [float(x) for p in (work / "logs" / target).rglob("*.log") if "batches" not in p.parts
                    for x in FINISHED.findall(p.read_text())]
    if shims is not None:
        result["controller_rpcs"] = controller_rpcs() - rpcs - 1  # less sdiag's own request
        result["controller_rpcs_per_s"] = round(result["controller_rpcs"] / wall, 2)
        lines = [line.split() for line in calls.read_text().splitlines()] if calls.exists() else []
        submit = [(float(t), name) for t, name, where in lines if where == "submit"]
        sbatch = [t for t, name in submit if name == "sbatch"]
        queries = [t for t, name in submit if name in STATUS_QUERIES]
        result.update(
            first_submit_s=round(min(sbatch) - t0, 1) if sbatch else None,
            submissions=len(sbatch), submissions_per_s=round(len(sbatch) / wall, 3),
            busiest_second_submissions=busiest(sbatch),
            status_queries=len(queries), status_queries_per_s=round(len(queries) / wall, 3),
            busiest_second_status_queries=busiest(queries),
            busiest_second_commands=busiest([t for t, _ in submit]),
            in_job_commands=Counter(name for _, name, where in lines if where != "submit"),
        )
        job_ids = re.findall(r"has been submitted with SLURM jobid (\d+)", done.stdout + done.stderr)
        waits, runtimes, steps = sacct_times(job_ids)
        result.update(slurm_jobs=len(job_ids), queue_wait_s=summary(waits), job_run_s=summary(runtimes))
        if not per_artifact:
            per_artifact = steps
    result["per_artifact_s"] = summary(per_artifact)
    return result


def bench_mode(work: Path, mode: str, profile: Path, artifacts: int, targets: list[str]) -> dict:
    runs = work / "runs"
    build_tree(runs, artifacts)
    (work / "archive").mkdir()
    slurm_mode = mode != "local"
    profiles = ["--profile", str(profile), *(["--profile", str(slurm.site_profile(work))] if slurm_mode else [])]
    result = {}
    for target in targets:
        result[target] = run_target(work, target, profiles, work if slurm_mode else None)
        print(f"{mode} {target}: {result[target]}", file=sys.stderr)
    receipts = len(list(runs.glob("*/*/*/*/checkpoint_artifacts/*/.uploaded")))
    if receipts != artifacts:
        raise SystemExit(f"{mode}: {receipts} receipts for {artifacts} artifacts")
    return result


def table(result: dict) -> str:
    def cell(value) -> str:
        if value is None:
            return "-"
        if isinstance(value, dict):
            return f"{value['median']}/{value['max']}"
        return str(value)

    cols = [("wall s", "wall_s"), ("1st sbatch s", "first_submit_s"), ("jobs", "slurm_jobs"),
            ("sbatch", "submissions"), ("sbatch max/s", "busiest_second_submissions"),
            ("status q", "status_queries"), ("q/s", "status_queries_per_s"),
            ("q max/s", "busiest_second_status_queries"), ("cmds max/s", "busiest_second_commands"),
            ("ctld RPCs", "controller_rpcs"),
            ("RPC/s", "controller_rpcs_per_s"), ("queue s med/max", "queue_wait_s"),
            ("job s med/max", "job_run_s"), ("artifact s med/max", "per_artifact_s")]
    rows = [["mode", "target", *(c for c, _ in cols)]]
    for mode, targets in result.items():
        if not isinstance(targets, dict):
            continue
        for target, figures in targets.items():
            rows.append([mode, target, *(cell(figures.get(key)) for _, key in cols)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=int, default=100)
    parser.add_argument("--modes", default="grouped,local")
    parser.add_argument("--targets", default="publish_all")
    parser.add_argument("--keep", type=Path, help="work in this new directory and keep it (logs, reports)")
    args = parser.parse_args()
    result: dict = {"artifacts": args.artifacts}
    targets = args.targets.split(",")
    with tempfile.TemporaryDirectory(prefix="ckptflow-slurm-bench-") as tmp:
        if args.keep:
            args.keep.mkdir(parents=True)
            tmp = str(args.keep.resolve())
        profiles = {"grouped": REPO / "profiles" / "slurm", "local": REPO / "profiles" / "default"}
        for mode in args.modes.split(","):
            result[mode] = bench_mode(Path(tmp) / mode, mode, profiles[mode], args.artifacts, targets)
    print(table(result), file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
