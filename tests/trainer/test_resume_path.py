"""An explicit resume path is judged by its real path and must be a resumable checkpoint; a save in
progress is never a resume point. Through the real ``ckptflow resume-check`` and ``examples/train_tiny.py``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from trainer_helpers import tiny_training

from ckptflow.trainer.write import write_artifact
from helpers import REPO
from helpers.cli import run_cli
from helpers.trees import tree_bytes


def checkpoint(attempt, it, *, trainer=True, state_iter=None):
    d = attempt / "checkpoints" / f"iter_{it:06d}"
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(b"m")
    if trainer:
        n = it if state_iter is None else state_iter
        torch.save({"optimizer_step": n, "iter": n}, d / "trainer.pt")
    return d


@pytest.fixture
def attempt(tmp_path):
    """Model-only artifacts at 100 and 300, a complete checkpoint at 300, an interrupted one at 400."""
    a = tmp_path / "run" / "ts"
    net, _ = tiny_training(steps=1)
    write_artifact(a, 100, {"model": net})
    write_artifact(a, 300, {"model": net})
    checkpoint(a, 300)
    checkpoint(a, 400, trainer=False)
    torch.save({"net": net.state_dict()}, a / "init.pt")
    return a


REFUSED = {  # explicit path (relative to the attempt) -> what the refusal names
    "file_inside_model_only_artifact": ("checkpoint_artifacts/iter_000300/model.pt", "is inside the artifact"),
    "missing_checkpoint": ("checkpoints/iter_000900", "does not exist"),
    "interrupted_save_without_trainer_state": ("checkpoints/iter_000400", "has no trainer.pt"),
    "dotdot_out_of_a_checkpoint": ("checkpoints/iter_000400/../../init.pt", "cannot be established"),
    "model_only_artifact_directory": ("checkpoint_artifacts/iter_000300", "model-only artifact"),
    "trainer_state_file_inside_a_checkpoint": ("checkpoints/iter_000300/trainer.pt", "file inside the checkpoint"),
}


@pytest.mark.parametrize("case", REFUSED, ids=list(REFUSED))
@pytest.mark.slow
def test_resume_check_refuses_what_is_not_a_resumable_checkpoint(attempt, case):
    rel, named = REFUSED[case]
    before = tree_bytes(attempt)
    proc = run_cli("resume-check", "--attempt-dir", str(attempt), "--resume-path", os.path.join(attempt, rel))
    assert proc.returncode == 1 and proc.report["decision"] == "refused", proc.stdout
    assert named in proc.report["reason"] and len(proc.report["remedies"]) == 3
    assert tree_bytes(attempt) == before


@pytest.mark.slow
def test_the_real_path_is_judged_and_reported(attempt, tmp_path):
    link = tmp_path / "resume-here"
    link.symlink_to(attempt / "checkpoints" / "iter_000300")
    proc = run_cli("resume-check", "--attempt-dir", str(attempt), "--resume-path", str(link))
    assert proc.returncode == 0 and proc.report["resume_iteration"] == 300
    assert proc.report["resume_from"] == str(attempt / "checkpoints" / "iter_000300")
    lying = checkpoint(attempt, 500, state_iter=7)  # its trainer state says 7
    proc = run_cli("resume-check", "--attempt-dir", str(attempt), "--resume-path", str(lying))
    assert proc.returncode == 1 and "says iteration 7" in proc.report["reason"]


def test_a_save_in_progress_is_never_a_resume_point(attempt):
    from ckptflow.trainer.checkpoints import begin_checkpoint_save

    d = attempt / "checkpoints" / "iter_000500"
    begin_checkpoint_save(d)
    torch.save({"optimizer_step": 500, "iter": 500}, d / "trainer.pt")  # trainer state first, shards coming
    proc = run_cli("resume-check", "--attempt-dir", str(attempt))
    assert proc.returncode == 0 and proc.report["resume_iteration"] == 300
    proc = run_cli("resume-check", "--attempt-dir", str(attempt), "--resume-path", str(d))
    assert proc.returncode == 1 and ".save-in-progress" in proc.report["reason"]


@pytest.mark.parametrize("rel", ["checkpoint_artifacts/iter_000300/model.pt", "checkpoints/iter_000400/../../init.pt"])
@pytest.mark.slow
def test_the_example_trainer_refuses_the_same_paths_and_writes_nothing(attempt, rel):
    before = tree_bytes(attempt.parent)
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "train_tiny.py"), "--run-dir", str(attempt),
                           "--steps", "304", "--save-every", "2", "--resume-path", os.path.join(attempt, rel)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 3, proc.stderr
    assert "refusing to start" in proc.stderr and "step" not in proc.stdout
    assert tree_bytes(attempt.parent) == before
