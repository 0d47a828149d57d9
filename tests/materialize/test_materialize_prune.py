"""A prune never takes the files a materialize reads in place: ``--ckpt-dir`` marks the artifact while it
reads (``ckptflow.lock.reading``), and ``prune-verified --keep-free`` keeps it, naming the reader; once the materialize ends, the mark is gone and the same prune frees it."""

from __future__ import annotations

import signal

import pytest
from materialize_helpers import cli_args, cli_env, copy_tree

from ckptflow.archive.probe import run_probe
from ckptflow.archive.publish import publish_artifact
from ckptflow.jsonio import validate
from ckptflow.lock import readers_of
from ckptflow.store.local import LocalStore
from helpers.artifacts import make_artifact
from helpers.cli import finish, run_cli, start_cli, wait_for_file

TS = "20261129T000000Z"


@pytest.mark.slow
def test_an_artifact_a_materialize_reads_in_place_is_kept_naming_it_then_freed(models, tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(tmp_path / "cache"))
    store = LocalStore(tmp_path / "archive")
    store.root.mkdir()
    assert run_probe(store, "scratch").record.passed
    run = tmp_path / "runs" / "proj" / "group" / "run1" / TS
    read = copy_tree(models.artifact("qwen3", 1), run / "checkpoint_artifacts" / "iter_000300")
    newest = make_artifact(run, iteration=400)
    (newest / "optim.pt").unlink()
    for art in (read, newest):
        publish_artifact(art, store, f"proj/group/run1/{TS}/checkpoints", progress=False)
    flag = tmp_path / "paused"
    reader = start_cli(*cli_args(read, models.base(), tmp_path / "teacher"),
                       env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:after-open", CKPTFLOW_TEST_PAUSE_FILE=str(flag)))
    try:
        wait_for_file(flag, reader)  # it holds model.pt open
        proc = run_cli("prune-verified", "--runs-root", str(tmp_path / "runs"), "--keep-free", "100%")
        assert proc.returncode == 0, proc.stderr
        validate(proc.report, "report_prune_verified", what="prune-verified report")
        assert proc.report["removed"] == []
        reasons = {k["path"]: k["reason"] for k in proc.report["kept"]}
        assert f"being read in place by pid {reader.pid}" in reasons[str(read)]
        assert (read / "model.pt").stat().st_size == (models.artifact("qwen3", 1) / "model.pt").stat().st_size
        flag.unlink()
        out, err = finish(reader)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0 and '"status": "built"' in out, err
    assert sorted(p.name for p in read.parent.iterdir()) == ["iter_000300", "iter_000400"]  # the mark went

    proc = run_cli("prune-verified", "--runs-root", str(tmp_path / "runs"), "--keep-free", "100%")
    assert [r["path"] for r in proc.report["removed"]] == [str(read)] and not (read / "model.pt").exists()
    assert "newest" in {k["path"]: k["reason"] for k in proc.report["kept"]}[str(newest)]


@pytest.mark.slow
def test_a_killed_readers_mark_names_nobody_and_the_next_reader_removes_it(models, tmp_path):
    art = copy_tree(models.artifact("qwen3", 1), tmp_path / "run" / "checkpoint_artifacts" / "iter_000300")
    killed = run_cli(*cli_args(art, models.base(), tmp_path / "teacher"),
                     env=cli_env(CKPTFLOW_TEST_KILL_AT="materialize:after-open"))
    assert killed.returncode == -signal.SIGKILL
    marks = [p.name for p in art.parent.iterdir() if p.name.endswith(".reading")]
    assert len(marks) == 1 and marks[0].startswith(".iter_000300.")  # left by the killed reader
    assert readers_of(art) == []  # its process is gone: it names nobody
    proc = run_cli(*cli_args(art, models.base(), tmp_path / "teacher"))
    assert proc.returncode == 0 and proc.report["status"] == "built", proc.stderr
    assert sorted(p.name for p in art.parent.iterdir()) == ["iter_000300"]


@pytest.mark.slow
def test_a_reader_through_a_symlink_marks_the_artifact_it_resolves_to_and_keep_free_keeps_it(models, tmp_path,
                                                                                             monkeypatch):
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(tmp_path / "cache"))
    store = LocalStore(tmp_path / "archive")
    store.root.mkdir()
    assert run_probe(store, "scratch").record.passed
    run = tmp_path / "runs" / "proj" / "group" / "run1" / TS
    read = copy_tree(models.artifact("qwen3", 1), run / "checkpoint_artifacts" / "iter_000300")
    newest = make_artifact(run, iteration=400)
    (newest / "optim.pt").unlink()
    for art in (read, newest):
        publish_artifact(art, store, f"proj/group/run1/{TS}/checkpoints", progress=False)
    best = read.with_name("best")
    best.symlink_to(read.name)  # checkpoint_artifacts/best -> iter_000300
    flag = tmp_path / "paused"
    reader = start_cli(*cli_args(best, models.base(), tmp_path / "teacher"),
                       env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:after-open", CKPTFLOW_TEST_PAUSE_FILE=str(flag)))
    try:
        wait_for_file(flag, reader)
        proc = run_cli("prune-verified", "--runs-root", str(tmp_path / "runs"), "--keep-free", "100%")
        assert proc.returncode == 0, proc.stderr
        assert proc.report["removed"] == []
        assert f"being read in place by pid {reader.pid}" in {k["path"]: k["reason"] for k in proc.report["kept"]}[str(read)]
        assert (read / "model.pt").is_file()
        marks = [p.name for p in read.parent.iterdir() if p.name.endswith(".reading")]
        assert len(marks) == 1 and marks[0].startswith(".iter_000300."), marks
        assert readers_of(best) == readers_of(read) != []  # either spelling names the reader
        flag.unlink()
        out, err = finish(reader)
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    assert reader.returncode == 0 and '"status": "built"' in out, err
    assert sorted(p.name for p in read.parent.iterdir()) == ["best", "iter_000300", "iter_000400"]  # the mark went
