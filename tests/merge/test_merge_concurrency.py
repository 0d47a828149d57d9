"""Two merges of one output, a merge killed before its record, a merge pruned after publication.

Real ``ckptflow`` processes: one merger per output (``iter_N.merge.lock``), the decision re-checked
just before the commit when the lock is not effective (``CKPTFLOW_TEST_DISABLE=merge:lock``, as
``flock`` is on some cluster file systems), a published output never replaced; a directory whose merge
is in progress is not a committed artifact; a merge whose payload prune-verified released is complete.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from ckptflow.artifact import committed_artifacts
from ckptflow.records import merge_progress, merge_record
from helpers.cli import finish, run_cli, start_cli, wait_for_file
from helpers.trees import file_bytes

RUN = "proj/grp/run1/20261129T000000Z"


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    return tmp_path / "runs"


@pytest.fixture
def out(runs: Path) -> Path:
    """``<runs>/<RUN>/checkpoint_artifacts/iter_000300/model.pt`` (directory not created)."""
    return runs / RUN / "checkpoint_artifacts" / "iter_000300" / "model.pt"


def _avg(moe, out):
    return ("merge", "--mode", "avg", "--experts", ",".join(map(str, moe.paths())), "--out", str(out))


def _tv(moe, out):
    return ("merge", "--mode", "tv", "--base", str(moe.base), "--experts", ",".join(map(str, moe.paths())),
            "--out", str(out))


def _paused(args, flag: Path, point: str, **env) -> object:
    proc = start_cli(*args, env={"CKPTFLOW_TEST_PAUSE_AT": point, "CKPTFLOW_TEST_PAUSE_FILE": str(flag), **env})
    wait_for_file(flag, proc)
    return proc


def _publish(artifact: Path, archive: Path, env: dict):
    archive.mkdir(exist_ok=True)
    return run_cli("publish", "--artifact-dir", str(artifact), "--upload-prefix", f"{RUN}/checkpoints",
                   "--bucket", f"file://{archive}", env=env)


@pytest.mark.slow
def test_a_second_merge_waits_for_the_first_then_decides_on_its_committed_output(moe, out, tmp_path):
    first = _paused(_avg(moe, out), tmp_path / "first", "merge:after-model-write")
    second = _paused(_tv(moe, out), tmp_path / "second", "merge:lock-wait")
    (tmp_path / "second").unlink()  # it waits for the lock, not for the pause file
    (tmp_path / "first").unlink()
    _, stderr = finish(first)
    assert first.returncode == 0, stderr
    _, stderr2 = finish(second)
    committed = file_bytes(out.parent)
    # The second request saw the first one's completed merge: another request, refused without --force.
    assert second.returncode == 1 and "--force" in stderr2, stderr2
    assert file_bytes(out.parent) == committed
    record = merge_record.read_merge_record(out.parent)
    assert record.request.mode == "avg" and not merge_progress.path_in(out.parent).exists()
    assert run_cli(*_avg(moe, out)).report["status"] == "skipped"


@pytest.mark.slow
def test_a_merge_that_will_not_wait_is_refused_naming_the_holder(moe, out, tmp_path):
    first = _paused(_avg(moe, out), tmp_path / "first", "merge:after-model-write")
    try:
        busy = run_cli(*_tv(moe, out), "--lock-wait-seconds", "0")
        assert busy.returncode == 1 and f"pid {first.pid} on host" in busy.stderr and "being merged" in busy.stderr
        assert not out.exists() and not merge_record.path_in(out.parent).exists()
    finally:
        (tmp_path / "first").unlink()
        finish(first)
    assert first.returncode == 0


@pytest.mark.parametrize("second", ["same-request", "forced-other-request"])
@pytest.mark.slow
def test_without_an_effective_lock_the_commit_rechecks_and_never_replaces_a_published_merge(
        moe, out, tmp_path, second):
    env = {"CKPTFLOW_TEST_DISABLE": "merge:lock", "CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}
    args = _avg(moe, out) if second == "same-request" else (*_tv(moe, out), "--force")
    late = _paused(args, tmp_path / "late", "merge:after-model-write", **env)  # decided on an empty directory
    early = run_cli(*_avg(moe, out), env=env)
    assert early.returncode == 0 and early.report["status"] == "built", early.stderr
    assert _publish(out.parent, tmp_path / "archive", env).returncode == 0
    published = {k: v for k, v in file_bytes(out.parent).items() if not k.endswith(".tmp")}  # not the late one's temporary
    (tmp_path / "late").unlink()
    stdout, stderr = finish(late)
    assert file_bytes(out.parent) == published  # byte for byte the published merge
    assert not any(p.name.endswith(".tmp") for p in out.parent.iterdir())
    if second == "same-request":
        assert late.returncode == 0, stderr
        assert '"status": "skipped"' in stdout
    else:
        assert late.returncode == 1 and "published" in stderr, stderr
    verify = run_cli("verify", "--artifact-dir", str(out.parent), env=env)
    assert verify.returncode == 0, verify.stderr


@pytest.mark.slow
def test_without_an_effective_lock_a_commit_overtaken_by_another_writes_no_record_over_it(moe, out, tmp_path):
    env = {"CKPTFLOW_TEST_DISABLE": "merge:lock"}
    late = _paused((*_tv(moe, out), "--force"), tmp_path / "late", "merge:after-model-rename", **env)
    early = run_cli(*_avg(moe, out), env=env)  # finds the late one's marker naming its model.pt: rebuilds over it
    assert early.returncode == 0 and early.report["status"] == "built", early.stderr
    committed = file_bytes(out.parent)
    (tmp_path / "late").unlink()
    _, stderr = finish(late)
    assert late.returncode == 1 and "another merge committed into this directory" in stderr, stderr
    assert file_bytes(out.parent) == committed
    assert run_cli(*_avg(moe, out)).report["status"] == "skipped"  # the avg merge, complete and consistent


@pytest.mark.slow
def test_a_merge_killed_between_manifest_and_record_is_not_committed_and_its_rerun_completes_it(
        moe, out, runs, tmp_path):
    env = {"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}
    killed = run_cli(*_avg(moe, out), env={"CKPTFLOW_TEST_KILL_AT": "merge:after-manifest"})
    assert killed.returncode == -signal.SIGKILL
    artifact = out.parent
    assert merge_progress.path_in(artifact).exists() and not merge_record.path_in(artifact).exists()
    assert committed_artifacts(runs) == []  # what publish_all and the workflow discover
    before = file_bytes(artifact)
    refused = _publish(artifact, tmp_path / "archive", env)
    assert refused.returncode == 1 and merge_progress.FILENAME in refused.stderr, refused.stderr
    assert file_bytes(artifact) == before and list((tmp_path / "archive").iterdir()) == []
    status = run_cli("status", str(runs), "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert [(r["local"]["state"], r["merged"]["state"]) for r in status.report["rows"]] == [("incomplete", "in-progress")]
    rerun = run_cli(*_avg(moe, out), env=env)
    assert rerun.returncode == 0 and rerun.report["status"] == "built", rerun.stderr
    assert committed_artifacts(runs) == [(RUN, "iter_000300")]
    assert _publish(artifact, tmp_path / "archive", env).returncode == 0


@pytest.mark.slow
def test_a_merge_pruned_after_publication_is_complete(moe, out, tmp_path):
    env = {"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}
    assert run_cli(*_avg(moe, out), env=env).returncode == 0
    assert _publish(out.parent, tmp_path / "archive", env).returncode == 0
    probe = run_cli("probe", "--bucket", f"file://{tmp_path / 'archive'}", "--prefix", f"{RUN}/checkpoints", env=env)
    assert probe.returncode == 0, probe.stderr
    pruned = run_cli("prune-verified", "--paths", str(out.parent), env=env)
    assert pruned.returncode == 0 and not out.exists(), pruned.stderr
    before = file_bytes(out.parent)
    again = run_cli(*_avg(moe, out), env=env)
    assert again.returncode == 0, again.stderr
    assert again.report["status"] == "skipped" and "pruned" in again.report["reason"]
    assert file_bytes(out.parent) == before
    other = run_cli(*_tv(moe, out), env=env)  # another request is still refused, by name
    assert other.returncode == 1 and "--force" in other.stderr
    # A pruned model.pt whose record the receipt does not bind is damage, not a prune: never rebuilt.
    (out.parent / merge_record.FILENAME).write_bytes((out.parent / merge_record.FILENAME).read_bytes() + b"\n")
    damaged = run_cli(*_avg(moe, out), env=env)
    assert damaged.returncode == 1 and "published" in damaged.stderr


def _killed_after_record(moe, out):
    """A merge killed between writing its record and removing its in-progress marker."""
    killed = run_cli(*_avg(moe, out), env={"CKPTFLOW_TEST_KILL_AT": "merge:after-record"})
    assert killed.returncode == -signal.SIGKILL
    assert merge_progress.path_in(out.parent).exists() and merge_record.path_in(out.parent).exists()


@pytest.mark.slow
def test_a_merge_killed_before_removing_its_marker_is_finished_by_the_rerun(moe, out, runs):
    _killed_after_record(moe, out)
    rerun = run_cli(*_avg(moe, out))
    assert rerun.returncode == 0 and rerun.report["status"] == "skipped", rerun.stderr
    assert not merge_progress.path_in(out.parent).exists()
    assert committed_artifacts(runs) == [(RUN, "iter_000300")]


@pytest.mark.slow
def test_a_stale_marker_of_a_committed_merge_is_cleared_by_publish_and_prune_and_the_artifact_is_freed(
        moe, out, tmp_path):
    env = {"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}
    _killed_after_record(moe, out)
    stale = merge_progress.path_in(out.parent).read_bytes()
    assert _publish(out.parent, tmp_path / "archive", env).returncode == 0
    assert not merge_progress.path_in(out.parent).exists()
    probe = run_cli("probe", "--bucket", f"file://{tmp_path / 'archive'}", "--prefix", f"{RUN}/checkpoints", env=env)
    assert probe.returncode == 0, probe.stderr

    merge_progress.path_in(out.parent).write_bytes(stale)  # as the kill left it: a prune finishes it too
    pruned = run_cli("prune-verified", "--paths", str(out.parent), env=env)
    assert pruned.returncode == 0 and pruned.report["kept"] == [], pruned.stdout
    assert pruned.report["freed_bytes"] > 0 and not out.exists()
    assert not merge_progress.path_in(out.parent).exists()


@pytest.mark.slow
def test_a_merge_killed_while_creating_its_lock_leaves_no_lock_file_after_the_next_merge(moe, out):
    lock = out.parent.with_name(out.parent.name + ".merge.lock")
    killed = run_cli(*_avg(moe, out), env={"CKPTFLOW_TEST_KILL_AT": "merge:lock-created"})
    assert killed.returncode == -signal.SIGKILL
    assert lock.exists()
    rerun = run_cli(*_avg(moe, out))
    assert rerun.returncode == 0 and rerun.report["status"] == "built", rerun.stderr
    assert sorted(p.name for p in out.parent.parent.iterdir()) == [out.parent.name]  # no lock, no temporary
