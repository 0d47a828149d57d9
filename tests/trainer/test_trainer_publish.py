"""save_and_publish: the save returns while its publication runs in the background, one publication in
flight per run, later saves queued in order; a failed upload is logged with the exact retry command and
the local artifact kept."""

from __future__ import annotations

import dataclasses
import json
import logging
import shlex
import threading

import pytest
from trainer_helpers import tiny_training

import ckptflow.trainer.publish as trainer_publish_module
from ckptflow.archive.publish import publish_artifact
from ckptflow.errors import PreflightFailed
from ckptflow.records.receipt import read_receipt
from ckptflow.store.base import DEFAULT_MULTIPART_THRESHOLD
from ckptflow.store.open import open_bucket_arg
from ckptflow.trainer import UploadSettings, artifact_dir_for, save_and_publish, wait_for_publications
from ckptflow.trainer.publish import trainer_publish
from helpers.artifacts import UPLOAD_PREFIX, make_artifact
from helpers.cli import run_cli
from helpers.paused import resume, start_paused
from helpers.trees import tree_bytes

PREFIX = "proj/group/run/ts/checkpoints"


@pytest.fixture
def gated_publish(monkeypatch):
    """The real publish_artifact, held at its start until ``gate`` is set; records concurrency and order."""
    gate, state = threading.Event(), {"running": 0, "max": 0, "order": [], "started": threading.Semaphore(0)}
    lock = threading.Lock()

    def held(artifact_dir, *args, **kwargs):
        with lock:
            state["running"] += 1
            state["max"] = max(state["max"], state["running"])
            state["order"].append(artifact_dir.name)
        state["started"].release()
        try:
            assert gate.wait(60)
            return publish_artifact(artifact_dir, *args, **kwargs)
        finally:
            with lock:
                state["running"] -= 1

    monkeypatch.setattr(trainer_publish_module, "publish_artifact", held)
    return gate, state


def test_saves_return_while_publication_runs_one_at_a_time_in_order(tmp_path, gated_publish):
    gate, state = gated_publish
    (tmp_path / "store").mkdir()
    upload = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'store'}", prefix=PREFIX)
    run = tmp_path / "run" / "ts"
    model, optim = tiny_training()
    save_and_publish(run, 10, {"model": model}, upload)
    assert state["started"].acquire(timeout=60)  # the first publication is running, and held
    save_and_publish(run, 20, {"model": model, "optimizer": optim}, upload)  # the step goes on meanwhile
    save_and_publish(run, 30, {"model": model}, upload)
    pub = trainer_publish_module.publisher_for(run, upload)
    assert pub.pending() == 3 and state["running"] == 1
    gate.set()
    outcomes = wait_for_publications(run, timeout=120)
    assert [o.ok for o in outcomes] == [True, True, True], [o.error for o in outcomes]
    assert state["max"] == 1 and state["order"] == ["iter_000010", "iter_000020", "iter_000030"]
    for it in (10, 20, 30):
        art = artifact_dir_for(run, it)
        assert (art / ".uploaded").exists() and read_receipt(art) is not None
        remote = tmp_path / "store" / "proj/group/run/ts/checkpoint_artifacts" / art.name
        assert (remote / ".posttrain-checkpoint-artifact.json").read_bytes() == (
            art / ".posttrain-checkpoint-artifact.json").read_bytes()


def test_failed_upload_is_logged_with_the_retry_command_and_kept(tmp_path, caplog, seaweedfs_bucket,
                                                                 seaweedfs_credentials_path):
    creds = tmp_path / "creds.json"
    good = json.loads(seaweedfs_credentials_path.read_text())
    creds.write_text(json.dumps({**good, "endpoint_url": "http://127.0.0.1:9"}))
    upload = UploadSettings(enabled=True, bucket=seaweedfs_bucket, credentials=str(creds), prefix=PREFIX)
    run = tmp_path / "run" / "ts"
    model, _ = tiny_training()
    with caplog.at_level(logging.ERROR, logger="ckptflow"):
        save_and_publish(run, 40, {"model": model}, upload)
        [outcome] = wait_for_publications(run, timeout=300)
    art = artifact_dir_for(run, 40)
    retry = shlex.join(["ckptflow", "publish", "--artifact-dir", str(art), "--upload-prefix", PREFIX,
                        "--bucket", seaweedfs_bucket, "--credentials", str(creds)])
    assert not outcome.ok and outcome.retry == retry and "127.0.0.1:9" in outcome.error
    assert retry in caplog.text and "snakemake publish_all" in caplog.text
    assert good["aws_secret_access_key"] not in caplog.text
    assert (art / "model.pt").exists() and not (art / ".uploaded").exists()
    before = tree_bytes(art)
    # The endpoint is back: the logged command publishes the kept artifact.
    creds.write_text(json.dumps(good))
    proc = run_cli(*shlex.split(retry)[1:])
    assert proc.returncode == 0, proc.stderr
    assert proc.report["status"] == "published"
    assert (art / ".uploaded").exists()
    # publishing adds its receipt and the part digests record beside the manifest; nothing else changes
    assert {k: v for k, v in tree_bytes(art).items() if k not in (".uploaded", ".posttrain-part-digests.json")} == before


def test_upload_disabled_only_writes(tmp_path):
    model, _ = tiny_training()
    save_and_publish(tmp_path, 1, {"model": model}, UploadSettings(enabled=False))
    assert (artifact_dir_for(tmp_path, 1) / ".posttrain-checkpoint-artifact.json").exists()
    assert not (artifact_dir_for(tmp_path, 1) / ".uploaded").exists()
    assert wait_for_publications(tmp_path) == []


def test_an_unexpected_publication_error_is_an_outcome_not_a_dead_thread(tmp_path, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(trainer_publish_module, "publish_artifact", broken)
    (tmp_path / "store").mkdir()
    upload = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'store'}", prefix=PREFIX)
    model, _ = tiny_training()
    with caplog.at_level(logging.ERROR, logger="ckptflow"):
        save_and_publish(tmp_path / "run", 1, {"model": model}, upload)
        save_and_publish(tmp_path / "run", 2, {"model": model}, upload)
        outcomes = wait_for_publications(tmp_path / "run", timeout=60)
    assert [o.ok for o in outcomes] == [False, False] and "RuntimeError: boom" in outcomes[0].error
    assert outcomes[1].retry in caplog.text


def test_the_first_save_of_a_run_publishes_its_artifact_once_even_when_the_catch_up_publication_already_ended(
        tmp_path, monkeypatch):
    """The first save of a run queues the run's unpublished artifacts, this one among them (it is committed);
    when that publication has already ended (here: failed at once) before the save queues its own, the
    artifact is not published a second time."""
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    catch_up = trainer_publish_module.publish_pending

    def pending_then_done(run_dir, upload, **kwargs):
        queued = catch_up(run_dir, upload, **kwargs)
        wait_for_publications(run_dir, timeout=60)  # the catch-up publication has ended
        return queued

    monkeypatch.setattr(trainer_publish_module, "publish_artifact", broken)
    monkeypatch.setattr(trainer_publish_module, "publish_pending", pending_then_done)
    (tmp_path / "store").mkdir()
    upload = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'store'}", prefix=PREFIX)
    model, _ = tiny_training()
    save_and_publish(tmp_path / "run", 1, {"model": model}, upload)
    outcomes = wait_for_publications(tmp_path / "run", timeout=60)
    assert [(o.artifact_dir.name, o.ok) for o in outcomes] == [("iter_000001", False)]


def test_a_publication_racing_publish_and_prune_of_its_artifact_reports_it_archived(tmp_path, caplog, monkeypatch):
    """The trainer's publication stops after its first payload; meanwhile the workflow's side publishes the
    same artifact and prunes it (real processes). The trainer's publication then finds its next payload gone:
    that is an archived artifact, not a failure with "the local artifact is kept"."""
    archive = tmp_path / "archive"
    archive.mkdir()
    bucket = f"file://{archive}"
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(tmp_path / "cache"))
    art = make_artifact(tmp_path / "run1", model_bytes=DEFAULT_MULTIPART_THRESHOLD + 1)  # model.pt streams first
    (art / "optim.pt").unlink()  # a stale file the receipt would not cover: prune would keep the artifact
    store = open_bucket_arg(bucket, None)
    flag = tmp_path / "paused"
    with caplog.at_level(logging.INFO, logger="ckptflow"):
        worker, outcome = start_paused(lambda: trainer_publish(art, store, UPLOAD_PREFIX), "publish:after-payload",
                                       flag, monkeypatch)
        others = {"CKPTFLOW_TEST_PAUSE_AT": ""}
        published = run_cli("publish", "--artifact-dir", str(art), "--upload-prefix", UPLOAD_PREFIX, "--bucket", bucket,
                            env=others)
        assert published.returncode == 0, published.stderr
        pruned = run_cli("prune-verified", "--paths", str(art), env=others)
        assert pruned.returncode == 0, pruned.stderr + pruned.stdout
        assert not (art / "model.pt").exists() and not (art / "optim").exists(), pruned.stdout
        resume(worker, flag, monkeypatch)
    result = outcome["result"]
    assert result.ok, result.error
    assert result.result.status in ("skipped", "adopted")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert "by another publisher while this one ran" in caplog.text
    assert read_receipt(art) is not None


def test_the_trainer_derives_the_prefix_and_refuses_a_contradicting_one_like_the_cli(tmp_path, caplog):
    """No prefix: the run's own (the artifact's path in the runs layout). A prefix of another attempt:
    refused by name with the derived prefix as the remedy, nothing archived, the artifact kept; by the
    preflight of the first save (on by default), and without a preflight in the log."""
    run = tmp_path / "runs" / "proj" / "grp" / "run1" / "20261201T000000Z"
    (tmp_path / "store").mkdir()
    bucket = f"file://{tmp_path / 'store'}"
    model, _ = tiny_training()
    wrong = UploadSettings(enabled=True, bucket=bucket, prefix="proj/grp/run1/20261130T000000Z/checkpoints")
    with pytest.raises(PreflightFailed) as exc:
        save_and_publish(run, 10, {"model": model}, wrong)
    assert "pass --upload-prefix proj/grp/run1/20261201T000000Z/checkpoints" in str(exc.value)
    assert f"{artifact_dir_for(run, 10)} is committed and kept" in str(exc.value)
    unchecked = dataclasses.replace(wrong, preflight=False)
    with caplog.at_level(logging.ERROR, logger="ckptflow"):
        save_and_publish(run, 15, {"model": model}, unchecked)
    assert wait_for_publications(run, timeout=60) == [] and list((tmp_path / "store").iterdir()) == []
    assert "--upload-prefix proj/grp/run1/20261201T000000Z/checkpoints" in caplog.text
    assert not (artifact_dir_for(run, 10) / ".uploaded").exists()
    assert not (artifact_dir_for(run, 15) / ".uploaded").exists()
    derived = UploadSettings(enabled=True, bucket=bucket)
    save_and_publish(run, 20, {"model": model}, derived)
    [outcome] = wait_for_publications(run, timeout=120)
    assert outcome.ok, outcome.error
    assert outcome.result.destination.prefix == "proj/grp/run1/20261201T000000Z/checkpoint_artifacts/iter_000020"
    assert outcome.retry == shlex.join(["ckptflow", "publish", "--artifact-dir", str(artifact_dir_for(run, 20)),
                                        "--bucket", bucket])
