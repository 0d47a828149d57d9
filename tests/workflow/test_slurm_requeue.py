"""The Slurm page's job script for a training job that Slurm requeues, submitted to the single-node Slurm.

docs/slurm.md ("A training job that Slurm requeues") gives an sbatch script and the command that submits
it. Here that script runs as written, but for what a one-node test cluster without GPUs cannot give or
what names the site (each replaced line must be on the page, so a changed page fails here): no GPUs, 2 CPUs,
the checkout, the credentials, the runs root and the bucket of this test, two ranks, 6 steps with an
artifact every 2. It is submitted with the page's own command; the job pauses right after its first
artifact (``iter_000002``) is committed, and ``scontrol requeue`` kills and requeues it, as a preemption
does. What the page promises, checked: the second start writes into the same attempt ``<ts>`` (fixed at
submission, kept by Slurm across the requeue); the job's processes got SIGTERM; the second start resumes
after step 2 from the committed artifact, publishes the one the first start had not, and goes on; the job
ends COMPLETED, its first run REQUEUED, every start's log in one file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO
from helpers.cli import run_cli
from helpers.markdown import fenced

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

TIMEOUT = 600


def page_script() -> tuple[list[str], str]:
    """The job script of docs/slurm.md that Slurm requeues, and the command its comment says submits it."""
    scripts = [lines for lang, lines in fenced((REPO / "docs" / "slurm.md").read_text(encoding="utf-8"))
               if lang == "bash" and lines and lines[0] == "#!/bin/bash" and "#SBATCH --requeue" in lines]
    [script] = scripts
    [submit] = [m.group(0) for line in script for m in [re.search(r"sbatch --export=.+ train\.sbatch$", line)] if m]
    return script, submit


def for_this_cluster(script: list[str], *, runs: Path, credentials: Path, bucket: str) -> str:
    """The page's script with what names the site, or asks for what this cluster has not, replaced."""
    text = "\n".join(script) + "\n"
    replaced = {
        "#SBATCH --gpus-per-node=8\n": "",
        "#SBATCH --cpus-per-task=32\n": "#SBATCH --cpus-per-task=2\n",
        "C=/shared/ckptflow ": f"C={REPO} ",
        "=/shared/ckptflow-secrets/credentials.json\n": f"={credentials}\n",
        "--nproc-per-node 8 ": "--nproc-per-node 2 ",
        '"/shared/runs/myproj/': f'"{runs}/myproj/',
        "--steps 1000 --save-every 100 --bucket my-checkpoints\n": f"--steps 6 --save-every 2 --bucket {bucket}\n",
    }
    for old, new in replaced.items():
        assert text.count(old) == 1, f"docs/slurm.md: the requeued job's script no longer has {old!r}"
        text = text.replace(old, new)
    return text


ENDED = ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def _wait_for(check, what: str, job: str, log: Path, timeout: float = TIMEOUT) -> None:
    """Wait until ``check()``; fail, with the job's log, when the job ended first or after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        state = _state(job)
        assert state not in ENDED, f"job {job} ended ({state or 'gone'}) before {what}:\n{_text(log)[-4000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s:\n{_text(log)[-4000:]}"
        time.sleep(0.2)


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _accounted(job: str, timeout: float = 60) -> list[str]:
    """sacct's ``JobID|State`` rows of every start of ``job``, once the last one has ended there too:
    slurmctld tells slurmdbd of a job's end after squeue shows it, so sacct may still say RUNNING."""
    deadline = time.monotonic() + timeout
    while True:
        rows = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-o", "JobID,State", "-j", job],
                              capture_output=True, text=True, check=True).stdout.split()
        if not rows or rows[-1].split("|")[-1] not in ("PENDING", "RUNNING") or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)


def _state(job: str) -> str | None:
    """The job's state in squeue ("" once it has left squeue), None when squeue did not answer (a busy
    slurmctld), which is never taken for an end."""
    done = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
    if done.returncode != 0:
        return "" if "Invalid job id" in done.stderr else None
    return done.stdout.strip()


def test_the_slurm_pages_requeued_job_keeps_its_attempt_gets_sigterm_and_resumes_from_its_last_artifact(
    slurm_cluster, tmp_path, seaweedfs_bucket, seaweedfs_credentials_path
):
    script, submit = page_script()
    (tmp_path / "train.sbatch").write_text(
        for_this_cluster(script, runs=tmp_path / "runs", credentials=seaweedfs_credentials_path, bucket=seaweedfs_bucket),
        encoding="utf-8")
    (tmp_path / "logs").mkdir()
    pause = tmp_path / "paused"
    # Every save pauses right after its artifact is committed until the pause file is removed (the job's
    # environment is the submitter's: --export=ALL), so the requeue lands after iter_000002 and before step 3.
    # torchrun on PATH, as where a user submits from (the environment's bin directory first).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "CKPTFLOW_TEST_PAUSE_AT": "trainer:after-save", "CKPTFLOW_TEST_PAUSE_FILE": str(pause),
           "CKPTFLOW_PROGRESS": "0"}
    submitted = subprocess.run(["bash", "-c", submit], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    [job] = re.findall(r"Submitted batch job (\d+)", submitted.stdout)
    log = tmp_path / "logs" / f"sft-run1-{job}.out"
    try:
        run = tmp_path / "runs" / "myproj" / "sft" / "run1"
        committed = "*/checkpoint_artifacts/iter_000002/.posttrain-checkpoint-artifact.json"
        _wait_for(lambda: pause.exists() and any(run.glob(committed)), "pause after the first artifact", job, log)
        [attempt] = run.iterdir()
        assert not (attempt / "checkpoint_artifacts" / "iter_000002" / ".uploaded").exists()  # not yet queued

        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True, text=True, timeout=60)
        # Slurm makes a requeued batch job eligible again only later (its EligibleTime, two minutes on with
        # Slurm's defaults); the test does not wait for that, as an admin may not for a job held back.
        _wait_for(lambda: _state(job) == "PENDING", "the job pending again after the requeue", job, log)
        subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, capture_output=True,
                       text=True, timeout=60)
        # The first start's processes are gone once the second start has begun; from then on every pause
        # (the second start's saves) is let go at once.
        _wait_for(lambda: f"job {job} start 2, attempt" in _text(log), "second start of the job", job, log)
        pause.unlink(missing_ok=True)

        deadline = time.monotonic() + TIMEOUT
        while _state(job) not in ENDED:
            pause.unlink(missing_ok=True)
            assert time.monotonic() < deadline, f"job {job} still running after {TIMEOUT} s:\n{_text(log)[-4000:]}"
            time.sleep(0.2)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    text = _text(log)

    # One log for both starts (--open-mode=append), both with the attempt fixed at submission.
    starts = re.findall(rf"^job {job} start (\d), attempt (\S+)$", text, re.M)
    assert [n for n, _ in starts] == ["1", "2"], text[-4000:]
    assert starts[0][1] == starts[1][1] == attempt.name, (starts, attempt)
    # The requeue's signal: SIGTERM to the job's processes (torchrun's agent names it as it stops its ranks).
    first_run, second_run = text.split(f"job {job} start 2, attempt", 1)
    assert f"*** JOB {job} ON " in first_run and " DUE TO JOB REQUEUE ***" in first_run, first_run[-4000:]
    assert re.search(r"Received (15|SIGTERM) death signal", first_run), first_run[-4000:]
    # The second start resumes after step 2 from the committed artifact and publishes what the first did not.
    steps = re.findall(r"^step (\d+) loss", second_run, re.M)
    assert steps == ["3", "4", "5", "6"], second_run[-4000:]
    [result] = [json.loads(line) for line in second_run.splitlines() if line.startswith('{"')]
    assert result["run_dir"] == str(attempt) and result["saved"] == [4, 6] and not result["failed"], result
    assert result["published"] == ["iter_000002", "iter_000004", "iter_000006"], result
    assert [p.name for p in run.iterdir()] == [attempt.name]

    accounted = _accounted(job)
    assert accounted == [f"{job}|REQUEUED", f"{job}|COMPLETED"], accounted
    for it in (2, 4, 6):
        art = attempt / "checkpoint_artifacts" / f"iter_{it:06d}"
        verified = run_cli("verify", "--artifact-dir", str(art), "--credentials", str(seaweedfs_credentials_path))
        assert verified.returncode == 0 and verified.report["status"] == "verified", verified.stderr + verified.stdout
