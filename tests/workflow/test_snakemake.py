"""The Snakemake workflow: pending work from markers, publish → verify → prune, reruns do nothing."""

from __future__ import annotations

import json
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
        assert list(walk_files(art)) == [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded", ".verified.json"]
    assert (interrupted / "model.pt").exists()
    assert (tmp_path / "reports" / "prune" / "proj/grp/run1/20261129T000000Z" / "iter_000300.json").exists()

    again = snakemake(tmp_path, "-n", "prune_all", config=config, env=env)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def _pruned_workflow(tmp_path: Path, bucket: str) -> tuple[Path, dict[str, str], dict[str, str]]:
    runs = tmp_path / "runs"
    art = make_artifact(runs / "proj" / "run1" / "20261129T000000Z", iteration=300)
    (art / "optim.pt").unlink()  # an unselected file would (rightly) block pruning
    config = {
        "runs_root": str(runs), "bucket": bucket,
        "reports_dir": str(tmp_path / "reports"), "logs_dir": str(tmp_path / "logs"),
    }
    return art, config, {"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}


@pytest.mark.slow
def test_a_respelled_destination_neither_reruns_publication_nor_loses_a_pruned_artifacts_receipt(tmp_path):
    archive = tmp_path / "arch"
    archive.mkdir()
    art, config, env = _pruned_workflow(tmp_path, f"file://{archive}")
    first = snakemake(tmp_path, "prune_all", config=config, env=env)
    assert first.returncode == 0, first.stderr + first.stdout
    assert list(walk_files(art)) == [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded", ".verified.json"]
    receipt = (art / ".uploaded").read_bytes()

    again = snakemake(tmp_path, "prune_all", config={**config, "bucket": f"file://{archive}/"}, env=env)
    assert again.returncode == 0, again.stderr + again.stdout
    assert "Nothing to be done" in again.stdout + again.stderr
    assert (art / ".uploaded").read_bytes() == receipt


@pytest.mark.slow
def test_a_forced_publish_rerun_re_derives_the_receipt_of_a_pruned_artifact(tmp_path):
    archive = tmp_path / "arch"
    archive.mkdir()
    art, config, env = _pruned_workflow(tmp_path, f"file://{archive}")
    assert snakemake(tmp_path, "prune_all", config=config, env=env).returncode == 0
    before = json.loads((art / ".uploaded").read_text())

    # Snakemake removes the declared output before the job runs; publication must re-derive it.
    rerun = snakemake(tmp_path, "prune_all", "--forcerun", "publish", config=config, env=env)
    assert rerun.returncode == 0, rerun.stderr + rerun.stdout
    assert "rule publish:" in rerun.stdout + rerun.stderr
    after = json.loads((art / ".uploaded").read_text())
    assert {k: v for k, v in after.items() if k != "uploaded_at"} == {
        k: v for k, v in before.items() if k != "uploaded_at"}
    assert list(walk_files(art)) == [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded", ".verified.json"]
