"""What materialize may delete: only files a build writes in <out>, only its own stage, only verified bytes."""

from __future__ import annotations

import shutil

import pytest
from materialize_helpers import DEFAULTS, cli_args, cli_env, copy_tree, siblings

from ckptflow.archive.fetch import fetch_artifact
from ckptflow.archive.publish import publish_artifact
from ckptflow.digest import sha256_file
from ckptflow.errors import Refused
from ckptflow.materialize import materialize
from ckptflow.records import materialized as marker
from ckptflow.store import LocalStore
from helpers.cli import finish, run_cli, start_cli, wait_for_file
from helpers.trees import tree_state

UPLOAD_PREFIX = "proj/group/run1/20261129T000000Z/checkpoints"
ARTIFACT_PREFIX = "proj/group/run1/20261129T000000Z/checkpoint_artifacts/iter_000300"


def build(models, out, *, seed: int = 1, **kw):
    return materialize(ckpt_dir=models.artifact("qwen3", seed), base=models.base(), out=out, **{**DEFAULTS, **kw})


def file_archive(models, tmp_path) -> str:
    """A file:// archive of the tiny artifact (seed 1); the local copy is removed."""
    art = copy_tree(models.artifact("qwen3", 1), tmp_path / "local" / "checkpoint_artifacts" / "iter_000300")
    (tmp_path / "archive").mkdir()
    publish_artifact(art, LocalStore(tmp_path / "archive"), UPLOAD_PREFIX, progress=False)
    shutil.rmtree(tmp_path / "local")
    return f"file://{tmp_path / 'archive' / ARTIFACT_PREFIX}"






# --------------------------------------------------------------------------------------------- 1: user files in <out>


def add_user_files(out) -> None:
    (out / "eval").mkdir()
    (out / "eval" / "results.json").write_text('{"score": 0.5}')
    (out / "NOTES.md").write_text("my notes")


@pytest.mark.parametrize("force", [False, True])
def test_a_rebuild_refuses_by_name_when_out_holds_files_no_build_wrote(models, tmp_path, force):
    out = tmp_path / "teacher"
    build(models, out)
    add_user_files(out)
    (out / "tokenizer_config.json").write_text("{}")  # damaged: the same request is rebuilt, or forced
    before = tree_state(out)
    with pytest.raises(Refused) as err:
        build(models, out, force=force)
    message = str(err.value)
    assert "NOTES.md" in message and "eval/results.json" in message and "move" in err.value.remedy
    assert tree_state(out) == before  # nothing deleted, nothing written
    assert siblings(out) == []

    shutil.move(out / "NOTES.md", tmp_path / "NOTES.md")
    shutil.move(out / "eval", tmp_path / "eval")
    assert build(models, out, force=force).status == "built"
    assert build(models, out).status == "skipped"
    assert siblings(out) == []


@pytest.mark.slow
def test_a_file_added_to_out_during_the_build_is_never_deleted_by_the_swap(models, tmp_path):
    out = tmp_path / "teacher"
    build(models, out)
    (out / "tokenizer_config.json").write_text("{}")  # damaged: the same request rebuilds it by swap
    flag = tmp_path / "paused"
    proc = start_cli(*cli_args(models.artifact("qwen3", 1), models.base(), out),
                     env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:before-swap", CKPTFLOW_TEST_PAUSE_FILE=str(flag)))
    wait_for_file(flag, proc)
    add_user_files(out)  # after the decision, before the swap
    before = tree_state(out)
    flag.unlink()
    stdout, stderr = finish(proc)
    assert proc.returncode == 1 and '"status": "refused"' in stdout, stderr
    assert "NOTES.md" in stderr and "eval/results.json" in stderr
    assert tree_state(out) == before  # the old output and the user's files are back in place
    assert siblings(out) == []


@pytest.mark.slow
def test_removing_the_replaced_tree_deletes_only_what_a_build_wrote(models, tmp_path):
    out = tmp_path / "teacher"
    build(models, out)
    flag = tmp_path / "paused"
    proc = start_cli(*cli_args(models.artifact("qwen3", 1), models.base(), out, "--force"),
                     env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:after-swap", CKPTFLOW_TEST_PAUSE_FILE=str(flag)))
    wait_for_file(flag, proc)
    [aside] = [out.parent / n for n in siblings(out) if n.startswith("teacher.previous.")]
    (aside / "late.txt").write_text("written into the old tree by a process still inside it")
    flag.unlink()
    stdout, stderr = finish(proc)
    assert proc.returncode == 0 and '"status": "built"' in stdout, stderr
    assert tree_state(aside).keys() == {"late.txt"}  # the build's files went, the other one stayed
    assert (aside / "late.txt").read_text().startswith("written into")
    assert build(models, out).status == "skipped"  # a later run leaves the kept tree alone too
    assert (aside / "late.txt").is_file()


# --------------------------------------------------------------------------------------------- 2: stage cleanup


@pytest.mark.slow
def test_stage_cleanup_keeps_what_another_job_wrote_meanwhile(models, tmp_path):
    uri = file_archive(models, tmp_path)
    out = tmp_path / "teacher"
    scratch = tmp_path / "scratch"
    flag = tmp_path / "paused"
    proc = start_cli(*cli_args(uri, models.base(), out, "--stage-dir", str(scratch / "stage")),
                     env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:after-fetch", CKPTFLOW_TEST_PAUSE_FILE=str(flag)))
    wait_for_file(flag, proc)
    (scratch / "other-job-result.txt").write_text("another job's result")
    flag.unlink()
    stdout, stderr = finish(proc)
    assert proc.returncode == 0, stderr
    assert '"status": "built"' in stdout
    # Only this invocation's own staged files went; the directory another job wrote into stays.
    assert sorted(p.name for p in scratch.iterdir()) == ["other-job-result.txt"]
    assert (scratch / "other-job-result.txt").read_text() == "another job's result"
    assert siblings(out) == []


@pytest.mark.slow
def test_two_identical_archive_requests_at_once_do_not_share_a_stage(models, tmp_path):
    """The first to finish used to remove <out>.stage while the other was about to convert from it. The
    output lock serialises such requests; the stages must stay apart without it too (flock may be a no-op)."""
    uri = file_archive(models, tmp_path)
    out = tmp_path / "teacher"
    procs, flags = [], []
    try:
        for name in ("first", "second"):
            flag = tmp_path / f"paused-{name}"
            proc = start_cli(*cli_args(uri, models.base(), out), env=cli_env(
                CKPTFLOW_TEST_PAUSE_AT="materialize:after-fetch", CKPTFLOW_TEST_PAUSE_FILE=str(flag),
                CKPTFLOW_TEST_DISABLE="materialize:lock"))
            wait_for_file(flag, proc)  # both have fetched before either builds
            procs.append(proc)
            flags.append(flag)
        flags[0].unlink()
        first = finish(procs[0])
        assert procs[0].returncode == 0, first[1]
        flags[1].unlink()
        second = finish(procs[1])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert procs[1].returncode == 0, second[1]
    assert '"status": "built"' in first[0]
    assert '"status": "skipped"' in second[0] and "concurrent request" in second[0]
    assert marker.read_materialized(out).source.sha256 == sha256_file(models.artifact() / "model.pt").sha256
    assert siblings(out) == []  # each removed its own stage


# --------------------------------------------------------------------------------------------- 3: staged bytes


def tamper_keeping_size(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_a_tampered_staged_copy_is_fetched_again_before_a_build(models, tmp_path):
    uri = file_archive(models, tmp_path)
    stage = tmp_path / "stage"
    staged = fetch_artifact(uri, stage, progress=False).path
    tamper_keeping_size(staged / "model.pt")
    good = sha256_file(models.artifact() / "model.pt")

    out = tmp_path / "teacher"
    proc = run_cli(*cli_args(uri, models.base(), out, "--stage-dir", str(stage)))
    assert proc.returncode == 0, proc.stderr
    assert proc.report["fetch"]["status"] == "resumed" and proc.report["fetch"]["downloaded"] == ["model.pt"]
    assert sha256_file(staged / "model.pt") == good  # the staged copy was repaired, not trusted
    record = marker.read_materialized(out)
    assert (record.source.sha256, record.source.size) == (good.sha256, good.size)
    # The teacher holds the archive's weights: the same shards as a build from the untouched local copy.
    reference = build(models, tmp_path / "reference")
    assert [(e.path, e.size, e.sha256) for e in record.shards] == [
        (e.path, e.size, e.sha256) for e in reference.record.shards]


@pytest.mark.slow
def test_a_killed_requests_private_stage_is_adopted_and_its_download_kept(models, tmp_path):
    uri = file_archive(models, tmp_path)
    out = tmp_path / "teacher"
    proc = run_cli(*cli_args(uri, models.base(), out), env=cli_env(CKPTFLOW_TEST_KILL_AT="fetch:before-complete"))
    assert proc.returncode == -9
    [left] = siblings(out)  # the killed request's own stage, model.pt verified inside
    assert left.startswith("teacher.stage.")
    proc = run_cli(*cli_args(uri, models.base(), out))
    assert proc.returncode == 0, proc.stderr
    assert proc.report["fetch"]["status"] == "resumed" and proc.report["fetch"]["downloaded"] == []
    assert proc.report["status"] == "built" and siblings(out) == []


@pytest.mark.slow
def test_a_staged_copy_replaced_after_the_fetch_verified_it_is_refused_by_its_digest(models, tmp_path):
    """The archived model.pt is hashed again from the descriptor the conversion reads: a copy replaced in the
    stage between the fetch's verification and the open is never converted under the archive's digest."""
    uri = file_archive(models, tmp_path)
    out = tmp_path / "teacher"
    assert materialize(artifact_uri=uri, base=models.base(), out=out, **DEFAULTS).status == "built"
    before = tree_state(out)
    stage, flag = tmp_path / "stage", tmp_path / "paused"
    proc = start_cli(*cli_args(uri, models.base(), out, "--force", "--stage-dir", str(stage), "--keep-staged"),
                     env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:after-fetch", CKPTFLOW_TEST_PAUSE_FILE=str(flag)))
    wait_for_file(flag, proc)
    staged = stage / "iter_000300" / "model.pt"
    other = staged.with_name("other.pt")
    shutil.copyfile(models.artifact("qwen3", 2) / "model.pt", other)  # another checkpoint's bytes
    other.replace(staged)
    flag.unlink()
    _, stderr = finish(proc)
    assert proc.returncode == 1, stderr
    assert str(staged) in stderr and "after the fetch" in stderr and sha256_file(staged).sha256 in stderr, stderr
    assert tree_state(out) == before and siblings(out) == []
