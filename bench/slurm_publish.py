"""Wall time of ``publish_all`` for many small artifacts: Slurm with job groups, Slurm without, and local.

Each mode publishes its own fresh copy of the same tree (``--artifacts`` committed artifacts of a few KB,
built as bench/dryrun.py builds them) to its own ``file://`` archive, as a whole ``snakemake`` process:
``--profile profiles/slurm`` (20 publish jobs per allocation), the same profile without ``groups`` /
``group-components`` (one Slurm job per artifact), and ``profiles/default`` (local, ``cores: 2``). The Slurm
modes layer the test cluster's site profile (its account and partition, tests/helpers/slurm.py) over the
tracked one, as a user layers theirs. It needs the single-node Slurm (``make slurm-up``) and prints one JSON
object; one run per mode (it is long).

    python bench/slurm_publish.py [--artifacts 100] [--modes grouped,ungrouped,local]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from dryrun import REPO, SNAKEMAKE, build_tree

sys.path.insert(0, str(REPO / "tests"))
from helpers import slurm  # lives in tests/helpers: the test cluster's account and partition


def ungrouped_profile(into: Path) -> Path:
    profile = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text())
    profile.pop("groups", None)
    profile.pop("group-components", None)
    into.mkdir(parents=True)
    (into / "config.yaml").write_text(yaml.safe_dump(profile))
    return into


def publish_all(work: Path, profile: Path, artifacts: int, *, site: bool) -> dict:
    runs, archive = work / "runs", work / "archive"
    build_tree(runs, artifacts)
    archive.mkdir()
    profiles = ["--profile", str(profile), *(["--profile", str(slurm.site_profile(work))] if site else [])]
    cmd = ["timeout", "-k", "10", "3600", str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(work),
           "--configfile", str(REPO / "config" / "config.yaml"), *profiles, "publish_all",
           "--config", f"runs_root={runs}", f"bucket=file://{archive}", f"reports_dir={work}/reports",
           f"logs_dir={work}/logs"]
    t = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"publish_all with {profile} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    receipts = len(list(runs.glob("*/*/*/*/checkpoint_artifacts/*/.uploaded")))
    if receipts != artifacts:
        raise SystemExit(f"{profile}: {receipts} receipts for {artifacts} artifacts")
    slurm_jobs = len(re.findall(r"has been submitted with SLURM jobid", done.stdout + done.stderr))
    return {"wall_s": round(wall, 1), "slurm_jobs": slurm_jobs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=int, default=100)
    parser.add_argument("--modes", default="grouped,ungrouped,local")
    args = parser.parse_args()
    result: dict = {"artifacts": args.artifacts}
    with tempfile.TemporaryDirectory(prefix="ckptflow-slurm-bench-") as tmp:
        profiles = {"grouped": REPO / "profiles" / "slurm", "ungrouped": ungrouped_profile(Path(tmp) / "ungrouped"),
                    "local": REPO / "profiles" / "default"}
        for mode in args.modes.split(","):
            result[mode] = publish_all(Path(tmp) / mode, profiles[mode], args.artifacts, site=mode != "local")
            print(f"{mode}: {result[mode]}", file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
