"""Real processes: kill -9 at named points then rerun; two requests racing for one --out."""

from __future__ import annotations

import os

import pytest
from materialize_helpers import DEFAULTS, cli_args, cli_env, siblings

from ckptflow.conversion import verify_output
from ckptflow.digest import sha256_file
from ckptflow.errors import Refused
from ckptflow.materialize import materialize
from ckptflow.records import materialized as marker
from helpers.cli import run_cli, start_cli, wait_for_file
from helpers.trees import tree_state


def sha_of(models, seed: int) -> str:
    return sha256_file(models.artifact("qwen3", seed) / "model.pt").sha256


def rerun(models, out, seed: int, **kw):
    return materialize(ckpt_dir=models.artifact("qwen3", seed), base=models.base(), out=out, **{**DEFAULTS, **kw})


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after-convert", "before-swap", "mid-swap", "after-swap"])
def test_kill_during_a_forced_replacement_never_loses_the_old_output(models, tmp_path, point):
    out = tmp_path / "teacher"
    rerun(models, out, seed=1)
    old = tree_state(out)
    proc = run_cli(*cli_args(models.artifact("qwen3", 2), models.base(), out, "--force"),
                   env=cli_env(CKPTFLOW_TEST_KILL_AT=f"materialize:{point}"))
    assert proc.returncode == -9, proc.stderr

    if point == "mid-swap":  # <out> is absent: the old tree waits beside it, complete
        assert not out.exists()
        (aside,) = [out.parent / n for n in siblings(out) if n.startswith("teacher.previous.")]
        assert tree_state(aside) == old
    elif point == "after-swap":  # the new tree is in; the old one not yet removed
        assert marker.read_materialized(out).source.sha256 == sha_of(models, 2)
        (aside,) = [out.parent / n for n in siblings(out) if n.startswith("teacher.previous.")]
        kept = tree_state(aside)
        skipped = rerun(models, out, seed=2)  # the same request skips and deletes nothing, not even this
        assert skipped.status == "skipped" and skipped.removed_leftovers == []
        assert tree_state(aside) == kept
    else:
        assert tree_state(out) == old
    if point != "after-swap":
        # A rerun that is refused still gets the old output back, byte for byte, and changes nothing else.
        with pytest.raises(Refused, match=r"source model\.pt"):
            rerun(models, out, seed=2)
        assert tree_state(out) == old

    result = rerun(models, out, seed=2, force=True)  # a leftover previous tree goes at this swap
    assert result.status == "built"
    assert marker.read_materialized(out).source.sha256 == sha_of(models, 2)
    assert siblings(out) == []  # the killed run's staged and previous trees are gone
    assert rerun(models, out, seed=2).status == "skipped"


@pytest.mark.slow
def test_kill_before_the_first_publication_then_the_same_command_publishes_the_verified_tree(models, tmp_path):
    """The killed run's marked staged tree is the only complete tree: never deleted, recovered."""
    out = tmp_path / "teacher"
    args = cli_args(models.artifact("qwen3", 1), models.base(), out)
    proc = run_cli(*args, env=cli_env(CKPTFLOW_TEST_KILL_AT="materialize:after-marker"))
    assert proc.returncode == -9
    assert not out.exists() and [n.split(".")[1] for n in siblings(out)] == ["tmp"]
    [left] = [out.parent / n for n in siblings(out)]
    record = marker.read_materialized(left)
    inodes = {e.path: (left / e.path).stat().st_ino for e in record.shards}
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stderr
    report = proc.report
    assert report["status"] == "built" and report["reason"].startswith("recovered")
    assert report["recovered"] == str(left) and report["removed_leftovers"] == []
    assert report["verification"]["tensors_verified"] is True  # the same checks as a fresh build
    assert {e.path: (out / e.path).stat().st_ino for e in record.shards} == inodes  # published, not rebuilt
    assert marker.read_materialized(out) == record
    assert siblings(out) == []
    assert run_cli(*args).report["status"] == "skipped"


@pytest.mark.slow
@pytest.mark.parametrize("same", [True, False])
def test_racing_requests_with_the_lock_disabled_never_overwrite_each_other(models, tmp_path, monkeypatch, same):
    """flock is silently ineffective on some cluster file systems: with the lock switched off, the unique
    staged names and renames still leave one complete, verified output, never discarded by the loser."""
    monkeypatch.setenv("CKPTFLOW_TEST_DISABLE", "materialize:lock")
    out = tmp_path / "teacher"
    flag = tmp_path / "paused"
    slow = start_cli(*cli_args(models.artifact("qwen3", 1 if same else 2), models.base(), out),
                     env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:before-swap", CKPTFLOW_TEST_PAUSE_FILE=str(flag),
                                 CKPTFLOW_TEST_DISABLE="materialize:lock"))
    try:
        wait_for_file(flag, slow)
        assert rerun(models, out, seed=1).status == "built"  # the other request publishes first
        winner = tree_state(out)
        flag.unlink()
        stdout, stderr = slow.communicate(timeout=300)
    finally:
        if slow.poll() is None:
            slow.kill()
            slow.wait()
    if same:
        assert slow.returncode == 0, stderr
        assert '"status": "skipped"' in stdout and "concurrent request" in stdout
    else:
        assert slow.returncode == 1 and "published meanwhile" in stderr
    assert tree_state(out) == winner
    assert siblings(out) == []  # the loser removed its own staged tree
    assert not os.path.exists(out.with_name("teacher.lock"))  # the lock really was off in both
    assert marker.read_materialized(out).source.sha256 == sha_of(models, 1)
    verify_output(out, models.base(), models.artifact("qwen3", 1) / "model.pt", min_tensors=DEFAULTS["min_tensors"])



@pytest.mark.slow
def test_a_recovered_tree_that_loses_the_race_to_an_identical_build_is_removed(models, tmp_path, monkeypatch):
    """A request that adopted a killed run's complete tree, while another request of the same identity
    publishes first (the lock off, as on a file system that ignores flock), removes only its adopted copy:
    the published output stays as the winner left it."""
    monkeypatch.setenv("CKPTFLOW_TEST_DISABLE", "materialize:lock")
    out = tmp_path / "teacher"
    args = cli_args(models.artifact("qwen3", 1), models.base(), out)
    killed = run_cli(*args, env=cli_env(CKPTFLOW_TEST_KILL_AT="materialize:after-marker"))
    assert killed.returncode == -9, killed.stderr
    [left] = siblings(out)
    flag = tmp_path / "paused"
    slow = start_cli(*args, env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:before-swap", CKPTFLOW_TEST_PAUSE_FILE=str(flag),
                                        CKPTFLOW_TEST_DISABLE="materialize:lock"))
    try:
        wait_for_file(flag, slow)
        assert left not in siblings(out)  # adopted under the paused request's own name
        winner = rerun(models, out, seed=1)
        assert winner.status == "built" and winner.recovered is None  # a live request's tree is never taken
        published = tree_state(out)
        flag.unlink()
        stdout, stderr = slow.communicate(timeout=300)
    finally:
        if slow.poll() is None:
            slow.kill()
            slow.wait()
    assert slow.returncode == 0, stderr
    assert '"status": "skipped"' in stdout and "concurrent request" in stdout
    assert tree_state(out) == published
    assert siblings(out) == []  # the spare recovered copy is gone, nothing else beside <out>
    assert marker.read_materialized(out).source.sha256 == sha_of(models, 1)
