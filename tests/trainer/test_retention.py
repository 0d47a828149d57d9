"""Full-checkpoint retention: latest and the last N kept, older ones deleted only once uploaded; it and
artifact pruning never touch each other's directories."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_training

from ckptflow.archive.prune import prune_verified
from ckptflow.archive.publish import publish_artifact
from ckptflow.commands.summary import render
from ckptflow.errors import UsageError
from ckptflow.fsutil import unique_temp_path
from ckptflow.jsonio import validate
from ckptflow.store.local import LocalStore
from ckptflow.store.open import store_factory
from ckptflow.trainer import artifact_dir_for, write_artifact
from ckptflow.trainer.retention import checkpoint_provenance, retain_checkpoints
from helpers.cli import run_cli
from helpers.trees import tree_bytes


def ckpt(run, it, *, uploaded=None, resumable=True):
    d = run / "checkpoints" / f"iter_{it:07d}"
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(b"m" * 100)
    if resumable:
        (d / "trainer.pt").write_bytes(b"t" * 10)
    if uploaded is not None:
        (d / ".uploaded").write_text(uploaded)
    return d


def names(paths):
    return sorted(p.rsplit("/", 1)[1] for p in paths)


def test_keeps_latest_and_last_n_and_deletes_only_uploaded(tmp_path):
    run = tmp_path / "ts"
    for it in (1, 2, 3, 4, 5, 6):
        ckpt(run, it, uploaded="uploaded to s3://old-tool\n" if it != 3 else None)  # legacy text markers
    ckpt(run, 0, uploaded="x", resumable=False)  # an incomplete save: left alone
    (run / "checkpoints" / "latest").symlink_to("iter_0000002")
    dry = retain_checkpoints(run, 2, dry_run=True)
    assert names(dry.removed) == ["iter_0000001", "iter_0000004"] and all(
        (run / "checkpoints" / n).is_dir() for n in names(dry.removed))
    report = retain_checkpoints(run, 2)
    assert names(report.removed) == ["iter_0000001", "iter_0000004"]
    assert report.freed_bytes == 2 * (100 + 10 + len("uploaded to s3://old-tool\n"))
    reasons = {k["path"].rsplit("/", 1)[1]: k["reason"] for k in report.kept}
    assert reasons == {"iter_0000002": "latest", "iter_0000003": "not uploaded (no .uploaded)",
                       "iter_0000005": "one of the last 2", "iter_0000006": "one of the last 2"}
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "iter_0000000", "iter_0000002", "iter_0000003", "iter_0000005", "iter_0000006", "latest"]
    assert retain_checkpoints(run, 2).removed == []


def test_latest_as_a_text_file_and_keep_last_zero(tmp_path):
    run = tmp_path / "ts"
    for it in (1, 2):
        ckpt(run, it, uploaded="")
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1\n")
    assert names(retain_checkpoints(run, 0).removed) == ["iter_0000002"]
    with pytest.raises(UsageError):
        retain_checkpoints(run, -1)


def test_archive_bookkeeping_is_excluded_from_checkpoint_provenance(tmp_path):
    d = ckpt(tmp_path, 1)
    before = checkpoint_provenance(d)
    assert before == [("model.pt", 100), ("trainer.pt", 10)]
    (d / ".uploaded").write_text("{}")
    (d / ".uploaded.tmp").write_text("half")
    unique_temp_path(d / ".uploaded").write_text("receipt in flight")
    assert checkpoint_provenance(d) == before
    (d / "extra.bin").write_bytes(b"e")
    assert checkpoint_provenance(d) != before


def published_artifact(run, store_root):
    write_artifact(run, 10, {"model": tiny_training()[0]})
    art = artifact_dir_for(run, 10)
    publish_artifact(art, LocalStore(store_root), "p/g/r/ts/checkpoints", progress=False)
    return art


def test_retention_never_touches_checkpoint_artifacts(tmp_path):
    run = tmp_path / "ts"
    (tmp_path / "store").mkdir()
    art = published_artifact(run, tmp_path / "store")
    for it in (1, 2, 3):
        ckpt(run, it, uploaded="")
    before = tree_bytes(run / "checkpoint_artifacts")
    assert names(retain_checkpoints(run, 0).removed) == ["iter_0000001", "iter_0000002", "iter_0000003"]
    assert tree_bytes(run / "checkpoint_artifacts") == before and (art / "model.pt").exists()


def test_artifact_pruning_never_touches_checkpoints(tmp_path):
    run = tmp_path / "ts"
    (tmp_path / "store").mkdir()
    art = published_artifact(run, tmp_path / "store")
    old = ckpt(run, 1, uploaded="legacy text marker")
    before = tree_bytes(run / "checkpoints")
    report = prune_verified([art], store_factory(None), read_data=True)
    assert not (art / "model.pt").exists() and report.removed  # the artifact's payload went
    assert tree_bytes(run / "checkpoints") == before
    # Named explicitly, a checkpoint with a (legacy) marker is still not released by the artifact gate.
    report = prune_verified([old], store_factory(None), read_data=True)
    assert not report.removed and tree_bytes(run / "checkpoints") == before


def test_command_report_and_summary(tmp_path):
    run = tmp_path / "ts"
    for it in (1, 2, 3):
        ckpt(run, it, uploaded="")
    proc = run_cli("retain-checkpoints", "--run-dir", str(run), "--keep-last", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_retain_checkpoints", what="retain-checkpoints report")
    assert proc.report["status"] == "dry-run" and len(proc.report["removed"]) == 2
    assert "would remove 2 checkpoints" in render("retain-checkpoints", proc.report, 0.1)
    proc = run_cli("retain-checkpoints", "--run-dir", str(run), "--keep-last", "1")
    assert proc.returncode == 0 and proc.report["status"] == "retained"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_0000003"]
    assert run_cli("retain-checkpoints", "--run-dir", str(tmp_path / "none"), "--keep-last", "1").returncode == 1
