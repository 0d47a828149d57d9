"""examples/train_tiny.py end to end against SeaweedFS: background publication while steps continue, a
failed upload kept locally and published later by ``snakemake publish_all``, and a Slurm-requeue
restart over a committed artifact refused with nothing touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO
from helpers.cli import wait_until
from helpers.trees import tree_bytes

RUN = "proj/grp/run1/20261129T000000Z"
EXAMPLE = REPO / "examples" / "train_tiny.py"
SNAKEMAKE = Path(sys.executable).with_name("snakemake")


def start(run_dir: Path, out: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    with open(out, "w") as stdout, open(out.with_suffix(".err"), "w") as stderr:  # the child keeps its own copies
        return subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--run-dir", str(run_dir), *args], stdout=stdout, stderr=stderr,
            cwd=REPO, env={**os.environ, "CKPTFLOW_PROGRESS": "0", **(env or {})},
        )


@pytest.mark.slow
def test_background_publication_and_a_failed_upload_published_later(tmp_path, seaweedfs_bucket,
                                                                     seaweedfs_credentials_path):
    runs = tmp_path / "runs"
    run_dir = runs / RUN
    good = json.loads(seaweedfs_credentials_path.read_text())
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({**good, "endpoint_url": "http://127.0.0.1:9"}))  # the server is down
    flag, out = tmp_path / "pause", tmp_path / "out.txt"
    proc = start(run_dir, out, "--steps", "8", "--save-every", "2", "--step-seconds", "0.2",
                 "--bucket", seaweedfs_bucket, "--credentials", str(creds), "--upload-prefix", f"{RUN}/checkpoints",
                 env={"CKPTFLOW_TEST_PAUSE_AT": "trainer:before-publish", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    try:
        # iter 2's publication is held; training goes on to the next save meanwhile.
        wait_until(flag.exists, proc, "the first publication")
        wait_until(lambda: "saved iter_000004" in out.read_text(), proc, "a save while a publication is in flight")
        assert flag.exists() and proc.poll() is None
        flag.unlink()  # iter 2 is published against the stopped server: it fails
        wait_until(flag.exists, proc, "the second publication")  # iter 4's, after iter 2's failure
        assert "iter_000002 failed, the local artifact is kept" in out.with_suffix(".err").read_text()
        creds.write_text(json.dumps(good))  # the server is back
        flag.unlink()
        while proc.poll() is None:
            if flag.exists():
                flag.unlink()
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = out.with_suffix(".err").read_text()
    assert proc.returncode == 0, err
    result = json.loads(out.read_text().splitlines()[-1])
    assert result["saved"] == [2, 4, 6, 8]
    assert result["published"] == ["iter_000004", "iter_000006", "iter_000008"]
    [failed] = result["failed"]
    assert failed["artifact"] == "iter_000002" and failed["retry"] in err and "snakemake publish_all" in err
    kept = run_dir / "checkpoint_artifacts" / "iter_000002"
    assert (kept / "model.pt").exists() and not (kept / ".uploaded").exists()
    # Later, the workflow publishes what the trainer could not.
    done = subprocess.run(
        [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--configfile",
         str(REPO / "config" / "config.yaml"), "--cores", "1", "publish_all", "--config", f"runs_root={runs}",
         f"bucket={seaweedfs_bucket}", f"credentials={seaweedfs_credentials_path}",
         f"reports_dir={tmp_path / 'reports'}", f"logs_dir={tmp_path / 'logs'}"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("rule publish:") + done.stderr.count("rule publish:") == 1
    receipt = json.loads((kept / ".uploaded").read_text())
    assert receipt["destination"]["prefix"] == f"{RUN}/checkpoint_artifacts/iter_000002"


@pytest.mark.slow
def test_a_requeue_with_the_example_defaults_resumes_from_the_committed_artifact(tmp_path):
    """The requeue the docs describe, with nothing but the run's own flags: the default plan is the full one,
    so the killed job's artifact is a resume point."""
    run_dir = tmp_path / "runs" / RUN
    out = tmp_path / "out.txt"
    proc = start(run_dir, out, "--steps", "6", "--save-every", "2", env={"CKPTFLOW_TEST_KILL_AT": "trainer:after-save"})
    assert proc.wait(300) == -9  # killed right after committing iter 2, as a preempted job
    proc = start(run_dir, out, "--steps", "6", "--save-every", "2")  # the requeue: the same command
    assert proc.wait(300) == 0, out.with_suffix(".err").read_text()
    lines = out.read_text().splitlines()
    assert lines[0].startswith("step 3 ")  # resumed from iter 2, not from step 0
    assert json.loads(lines[-1])["saved"] == [4, 6]


def test_the_example_names_its_three_component_plans():
    shown = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, cwd=REPO,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr
    help_text = " ".join(shown.stdout.split())
    assert "--components PLAN" in help_text
    assert "one of three plans: model | model,optimizer | model,optimizer,trainer_state" in help_text
    wrong = subprocess.run([sys.executable, str(EXAMPLE), "--run-dir", "x", "--components", "optimizer"],
                           capture_output=True, text=True, cwd=REPO, timeout=120)
    assert wrong.returncode == 2
    assert "(choose from 'model', 'model,optimizer', 'model,optimizer,trainer_state')" in wrong.stderr


@pytest.mark.slow
def test_requeue_restart_over_a_committed_model_only_artifact_is_refused_and_nothing_touched(tmp_path):
    run_dir = tmp_path / "runs" / RUN
    out = tmp_path / "out.txt"
    model_only = ("--components", "model")
    proc = start(run_dir, out, "--steps", "8", "--save-every", "2", *model_only,
                 env={"CKPTFLOW_TEST_KILL_AT": "trainer:after-save"})
    assert proc.wait(300) == -9  # killed right after committing iter 2, as a preempted job
    art = run_dir / "checkpoint_artifacts" / "iter_000002"
    assert (art / ".posttrain-checkpoint-artifact.json").exists()
    before = tree_bytes(tmp_path / "runs")
    proc = start(run_dir, out, "--steps", "8", "--save-every", "2", *model_only, "--resume", "auto")  # the requeue
    assert proc.wait(300) == 3
    err = out.with_suffix(".err").read_text()
    assert f"refusing to start in attempt directory {run_dir}" in err and "step-0 restart" in err
    assert "new job name" in err and "resume=off" in err and "full component plan" in err
    assert tree_bytes(tmp_path / "runs") == before and "step 1" not in out.read_text()


def test_async_save_commits_and_publishes_every_save_and_a_kill_mid_write_resumes_from_the_last_commit(tmp_path):
    run_dir = tmp_path / "runs" / RUN
    archive = tmp_path / "archive"
    archive.mkdir()
    out = tmp_path / "out.txt"
    args = ["--steps", "6", "--save-every", "2", "--components", "model,optimizer,trainer_state", "--async-save",
            "--bucket", f"file://{archive}"]
    # Killed while iter 4's model.pt is written on the background thread (the second time a save reaches it).
    proc = start(run_dir, out, *args, env={"CKPTFLOW_TEST_PAUSE_AT": "trainer-save:writing-model.pt",
                                            "CKPTFLOW_TEST_PAUSE_FILE": str(tmp_path / "pause")})
    flag = tmp_path / "pause"
    wait_until(flag.exists, proc, "iter 2's background write")
    flag.unlink()
    wait_until(lambda: flag.exists() and "iter_000004" in flag.read_text(), proc, "iter 4's background write")
    proc.kill()
    assert proc.wait(60) == -9
    arts = run_dir / "checkpoint_artifacts"
    assert (arts / "iter_000002" / ".posttrain-checkpoint-artifact.json").exists()
    assert not (arts / "iter_000004" / ".posttrain-checkpoint-artifact.json").exists()
    proc = start(run_dir, out, *args)  # the requeue resumes from iter 2 and saves iter 4 again
    assert proc.wait(300) == 0, out.with_suffix(".err").read_text()
    report = json.loads(out.read_text().strip().splitlines()[-1])
    assert report["saved"] == [4, 6] and {"iter_000004", "iter_000006"} <= set(report["published"])
    assert "staged iter_000004" in out.read_text()
    for it in (2, 4, 6):  # iter 2's publication by the killed job, or else by the requeue's catch-up
        assert (arts / f"iter_{it:06d}" / ".uploaded").exists()
