"""Asynchronous saves: the state at the call, committed in the background, one staged copy per process,
failures raised at the handle, the next save or the wait, a kill during the background write leaving
nothing committed."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest
import torch
from trainer_helpers import tiny_training

import ckptflow.trainer.async_save as async_save
from ckptflow.errors import Refused
from ckptflow.records.manifest import read_manifest
from ckptflow.records.receipt import read_receipt
from ckptflow.trainer import (
    BackgroundSaveFailed,
    UploadSettings,
    artifact_dir_for,
    save_and_publish,
    wait_for_publications,
    write_artifact,
)
from ckptflow.trainer.resume import check_run_attempt, committed_artifacts
from helpers.memory import peak_rss_anon

MANIFEST = ".posttrain-checkpoint-artifact.json"


def full_plan(model, optim, step):
    return {"model": model, "optimizer": optim, "trainer_state": {"optimizer_step": step}}


def one_step(model, optim):
    optim.zero_grad()
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optim.step()


def wait_for(condition, what, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def pause_background_writes(monkeypatch, flag: Path) -> None:
    monkeypatch.setenv("CKPTFLOW_TEST_PAUSE_AT", "trainer-async:before-write")
    monkeypatch.setenv("CKPTFLOW_TEST_PAUSE_FILE", str(flag))


def let_background_writes_go(monkeypatch, flag: Path) -> None:
    monkeypatch.delenv("CKPTFLOW_TEST_PAUSE_AT")  # later background writes do not pause
    flag.unlink()


def dcp_metadata_without_save_identity(path: Path):
    """DCP's ``.metadata`` less its ``storage_meta`` (the checkpoint path and a fresh uuid: every save differs)."""
    meta = pickle.loads(path.read_bytes())
    return meta.state_dict_metadata, meta.planner_data, meta.storage_data


def test_an_optimizer_step_between_the_call_and_the_commit_never_reaches_the_artifact(tmp_path, monkeypatch):
    model, optim = tiny_training(steps=3)
    sync = write_artifact(tmp_path / "sync", 3, full_plan(model, optim, 3))
    flag = tmp_path / "pause"
    pause_background_writes(monkeypatch, flag)
    handle = write_artifact(tmp_path / "async", 3, full_plan(model, optim, 3), asynchronous=True)
    wait_for(flag.exists, "the background write to reach its pause point")
    art = artifact_dir_for(tmp_path / "async", 3)
    assert not handle.done() and not (art / MANIFEST).exists()
    for _ in range(3):  # the loop goes on before a byte is written
        one_step(model, optim)
    let_background_writes_go(monkeypatch, flag)
    manifest = handle.result(timeout=120)
    assert handle.done() and read_manifest(art) == manifest
    sync_art = artifact_dir_for(tmp_path / "sync", 3)
    files = [f.path for f in sync.physical_files()]
    assert files == [f.path for f in manifest.physical_files()]
    for rel in files:  # byte-identical to the synchronous save of the state at the call
        if rel.endswith(".metadata"):
            assert dcp_metadata_without_save_identity(art / rel) == dcp_metadata_without_save_identity(sync_art / rel)
        else:
            assert (art / rel).read_bytes() == (sync_art / rel).read_bytes(), rel
    saved = torch.load(art / "model.pt", weights_only=True)["net"]
    assert any(not torch.equal(saved[k], v) for k, v in model.state_dict().items())  # the steps changed the model


def test_tied_tensors_stay_one_storage_as_in_a_synchronous_save(tmp_path):
    shared = torch.randn(32)
    state = {"a": shared, "b": shared[8:16], "c": torch.arange(4.0)}
    write_artifact(tmp_path / "sync", 1, {"model": state})
    write_artifact(tmp_path / "async", 1, {"model": state}, asynchronous=True).result(timeout=120)
    got = (artifact_dir_for(tmp_path / "async", 1) / "model.pt").read_bytes()
    assert got == (artifact_dir_for(tmp_path / "sync", 1) / "model.pt").read_bytes()


def test_a_second_save_waits_for_the_first_staged_copy_and_reports_the_wait(tmp_path, monkeypatch, caplog):
    model, _ = tiny_training()
    flag = tmp_path / "pause"
    pause_background_writes(monkeypatch, flag)
    first = write_artifact(tmp_path, 1, {"model": model}, asynchronous=True)
    wait_for(flag.exists, "the first background write to pause")
    seen: dict = {}

    def second_save():
        seen["handle"] = write_artifact(tmp_path, 2, {"model": model}, asynchronous=True)
        seen["first_done_when_returned"] = first.done()

    caller = threading.Thread(target=second_save)
    with caplog.at_level(logging.WARNING, logger="ckptflow.trainer.async_save"):
        caller.start()
        assert "handle" not in seen  # one staged copy per process: it waits for the first to be written
        let_background_writes_go(monkeypatch, flag)
        caller.join(timeout=120)
    second = seen["handle"]
    assert seen["first_done_when_returned"] and second.waited_s > 0 and second.stall_s >= second.waited_s
    assert any("iteration 2 waited" in r.getMessage() for r in caplog.records)
    assert second.result(timeout=120).iteration == 2 and first.result().iteration == 1


def test_a_staging_that_fails_raises_at_the_call_once_and_writes_nothing(tmp_path, caplog):
    model, optim = tiny_training()
    unstageable = {"optimizer_step": 7, "lock": threading.Lock()}  # deepcopy refuses a lock
    with caplog.at_level(logging.WARNING, logger="ckptflow.trainer.async_save"):
        with pytest.raises(TypeError, match="lock"):
            write_artifact(tmp_path, 7, {"model": model, "optimizer": optim, "trainer_state": unstageable},
                           asynchronous=True)
    assert not artifact_dir_for(tmp_path, 7).exists() and committed_artifacts(tmp_path) == {}
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # the call raised it: not logged again
    # Raised once, and the staged slot is free again: the next save of that iteration goes on.
    write_artifact(tmp_path, 7, full_plan(model, optim, 7), asynchronous=True).result(timeout=120)
    assert list(committed_artifacts(tmp_path)) == [7]
    async_save.settle(tmp_path)  # nothing left to report


def test_a_committed_iteration_is_refused_at_the_call(tmp_path):
    model, _ = tiny_training()
    write_artifact(tmp_path, 4, {"model": model})
    with pytest.raises(Refused, match=r"iter_000004.*committed"):
        write_artifact(tmp_path, 4, {"model": model}, asynchronous=True)


def unpicklable_trainer_state(step):
    return {"optimizer_step": step, "hook": lambda: None}  # staged fine, fails when torch.save pickles it


def test_a_background_failure_raises_at_result_naming_the_iteration_and_commits_nothing(tmp_path):
    model, optim = tiny_training()
    handle = write_artifact(tmp_path, 5, {"model": model, "optimizer": optim,
                                          "trainer_state": unpicklable_trainer_state(5)}, asynchronous=True)
    with pytest.raises(BackgroundSaveFailed, match=r"iteration 5 .*iter_000005.* failed: .*nothing was committed") as err:
        handle.result(timeout=120)
    assert err.value.iteration == 5 and err.value.__cause__ is not None
    art = artifact_dir_for(tmp_path, 5)
    assert not (art / MANIFEST).exists() and (art / ".save-in-progress").is_file()
    assert committed_artifacts(tmp_path) == {}
    write_artifact(tmp_path, 6, {"model": model})  # reported once: the next save goes on


def test_a_background_failure_raises_at_the_next_save(tmp_path):
    model, optim = tiny_training()
    failed = write_artifact(tmp_path, 5, {"model": model, "optimizer": optim,
                                          "trainer_state": unpicklable_trainer_state(5)}, asynchronous=True)
    wait_for(failed.done, "the background save to end")
    with pytest.raises(BackgroundSaveFailed, match=r"iteration 5"):
        write_artifact(tmp_path, 6, {"model": model}, asynchronous=True)
    assert not artifact_dir_for(tmp_path, 6).exists()  # the failing call staged nothing
    write_artifact(tmp_path, 6, {"model": model}, asynchronous=True).result(timeout=120)


def test_a_background_failure_raises_at_wait_for_publications(tmp_path):
    (tmp_path / "store").mkdir()
    upload = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'store'}", prefix="p/g/r/ts/checkpoints")
    model, optim = tiny_training()
    save_and_publish(tmp_path, 5, {"model": model, "optimizer": optim,
                                   "trainer_state": unpicklable_trainer_state(5)}, upload, asynchronous=True)
    with pytest.raises(BackgroundSaveFailed, match=r"iteration 5"):
        wait_for_publications(tmp_path, timeout=120)
    assert wait_for_publications(tmp_path, timeout=120) == []  # reported once, nothing was published


def test_save_and_publish_commits_then_publishes_in_the_background(tmp_path):
    (tmp_path / "store").mkdir()
    upload = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'store'}", prefix="p/g/r/ts/checkpoints")
    run = tmp_path / "run" / "ts"
    model, optim = tiny_training()
    handle = save_and_publish(run, 10, full_plan(model, optim, 10), upload, asynchronous=True)
    outcomes = wait_for_publications(run, timeout=120)  # waits for the save first
    assert handle.done() and [o.ok for o in outcomes] == [True], [o.error for o in outcomes]
    art = artifact_dir_for(run, 10)
    assert read_manifest(art) == handle.result() and read_receipt(art) is not None


@pytest.mark.parametrize("fails", [False, True])
def test_no_staged_tensor_outlives_its_background_write(tmp_path, monkeypatch, fails):
    refs = []
    real = async_save.stage_components

    def capturing(components, plan, ranks=None):
        staged, ready = real(components, plan, ranks)
        refs.append(weakref.ref(next(iter(staged["model"].values()))))
        return staged, ready

    monkeypatch.setattr(async_save, "stage_components", capturing)
    model, optim = tiny_training()
    state = unpicklable_trainer_state(1) if fails else {"optimizer_step": 1}
    handle = write_artifact(tmp_path, 1, {"model": model, "optimizer": optim, "trainer_state": state},
                            asynchronous=True)
    wait_for(handle.done, "the background save to end")
    assert refs[0]() is None  # a failure kept for its report holds none either (its memory is the arena's)


def test_a_failure_after_the_commit_says_the_artifact_is_committed_and_kept(tmp_path):
    model, _ = tiny_training()
    typo = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'stroe'}", prefix="p/g/r/ts/checkpoints",
                          preflight=True)
    handle = save_and_publish(tmp_path, 10, {"model": model}, typo, asynchronous=True)
    art = artifact_dir_for(tmp_path, 10)
    with pytest.raises(BackgroundSaveFailed, match=rf"iteration 10 committed {art}, then failed: .*"
                                                   rf"ckptflow publish --artifact-dir {art}"):
        handle.result(timeout=120)
    assert (art / MANIFEST).exists() and wait_for_publications(tmp_path, timeout=120) == []


KILLED = """
import os, sys
sys.path.insert(0, sys.argv[2])
from trainer_helpers import tiny_training
from ckptflow.trainer import write_artifact
model, optim = tiny_training()
write_artifact(sys.argv[1], 1, {"model": model, "optimizer": optim, "trainer_state": {"optimizer_step": 1}})
os.environ["CKPTFLOW_TEST_KILL_AT"] = sys.argv[3]
handle = write_artifact(sys.argv[1], 2, {"model": model, "optimizer": optim, "trainer_state": {"optimizer_step": 2}},
                        asynchronous=True)
handle.result()
"""


@pytest.mark.parametrize("point", ["trainer-save:writing-model.pt", "trainer-save:before-trainer-state"])
def test_a_kill_during_the_background_write_commits_nothing_and_resumes_from_the_previous_artifact(tmp_path, point):
    proc = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path), str(Path(__file__).parent), point],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    art = artifact_dir_for(tmp_path, 2)
    assert not (art / MANIFEST).exists() and (art / ".save-in-progress").is_file()
    assert list(committed_artifacts(tmp_path)) == [1]
    decision = check_run_attempt(tmp_path)
    assert decision.decision == "resume" and decision.resume_iteration == 1, decision
    # The requeued job saves iteration 2 again: the killed save is discarded by its own record.
    model, optim = tiny_training()
    write_artifact(tmp_path, 2, full_plan(model, optim, 2), asynchronous=True).result(timeout=120)
    assert list(committed_artifacts(tmp_path)) == [1, 2]


MEMORY = """
import sys, time, torch
from ckptflow.trainer import write_artifact
def rss_anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
state = {f"w{i}": torch.randn(4 * 2**20) for i in range(8)}  # 128 MiB
write_artifact(sys.argv[1], 1, {"model": state})  # imports, threads, allocator warmed up
print(rss_anon(), flush=True)
for it in (2, 3, 4):  # the copy's memory is kept for the next save, never a second one
    write_artifact(sys.argv[1], it, {"model": state}, asynchronous=True).result()
"""


def test_peak_memory_above_the_loop_stays_within_the_staged_copy(tmp_path):
    peak, proc = peak_rss_anon([sys.executable, "-c", MEMORY, str(tmp_path)])
    assert proc.returncode == 0, proc.stderr
    baseline, staged = int(proc.stdout.split()[0]), 128 * 2**20
    assert peak - baseline <= 1.1 * staged, (peak - baseline) / staged
    assert all(os.path.isfile(artifact_dir_for(tmp_path, it) / MANIFEST) for it in (2, 3, 4))
