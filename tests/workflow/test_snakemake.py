"""The Snakemake workflow: pending work from markers, publish → verify → prune, reruns do nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptflow.fsutil import walk_files
from helpers import REPO
from helpers.artifacts import make_artifact

SNAKEMAKE = Path(sys.executable).with_name("snakemake")


def snakemake(workdir: Path, *args: str, config: dict[str, str], env: dict[str, str]) -> subprocess.CompletedProcess:
    cfg = [f"{k}={v}" for k, v in config.items()]
    return subprocess.run(
        [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--configfile",
         str(REPO / "config" / "config.yaml"), "--cores", "2", *args, "--config", *cfg],
        capture_output=True, text=True, timeout=600, env={**os.environ, **env},
    )


@pytest.mark.slow
def test_prune_all_publishes_verifies_and_prunes_then_has_nothing_to_do(
    tmp_path, seaweedfs_bucket, seaweedfs_credentials_path
):
    runs = tmp_path / "runs"
    run_dir = runs / "proj" / "grp" / "run1" / "20261129T000000Z"
    a = make_artifact(run_dir, iteration=300)
    b = make_artifact(run_dir, iteration=400, seed=1)
    for art in (a, b):
        (art / "optim.pt").unlink()  # an unselected file would (rightly) block pruning
    interrupted = run_dir / "checkpoint_artifacts" / "iter_000500"
    interrupted.mkdir()
    (interrupted / "model.pt").write_bytes(b"no manifest: an interrupted save")
    config = {
        "runs_root": str(runs), "bucket": seaweedfs_bucket, "credentials": str(seaweedfs_credentials_path),
        "reports_dir": str(tmp_path / "reports"), "logs_dir": str(tmp_path / "logs"),
    }
    env = {"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}

    dry = snakemake(tmp_path, "-n", "publish_all", config=config, env=env)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.count("rule publish:") == 2 and "iter_000500" not in dry.stdout

    run = snakemake(tmp_path, "prune_all", config=config, env=env)
    assert run.returncode == 0, run.stderr + run.stdout
    for art in (a, b):
        assert list(walk_files(art)) == [".posttrain-checkpoint-artifact.json", ".uploaded"]
    assert (interrupted / "model.pt").exists()
    assert (tmp_path / "reports" / "prune" / "proj/grp/run1/20261129T000000Z" / "iter_000300.json").exists()

    again = snakemake(tmp_path, "-n", "prune_all", config=config, env=env)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
