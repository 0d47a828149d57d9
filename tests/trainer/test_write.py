"""write_artifact: the planned components, each hashed as written, the manifest committed last."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from trainer_helpers import tiny_training

from ckptflow.digest import HashingWriter
from ckptflow.errors import Refused, UsageError
from ckptflow.records.manifest import read_manifest
from ckptflow.trainer import artifact_dir_for, write_artifact
from helpers.paused import resume, start_paused
from helpers.trees import tree_bytes


def test_model_only_plan_writes_net_state_dict_and_its_digest(tmp_path):
    model, _ = tiny_training()
    manifest = write_artifact(tmp_path / "run" / "ts", 10, {"model": model})
    art = tmp_path / "run" / "ts" / "checkpoint_artifacts" / "iter_000010"
    assert artifact_dir_for(tmp_path / "run" / "ts", 10) == art
    assert sorted(p.name for p in art.iterdir()) == [".posttrain-checkpoint-artifact.json", "model.pt"]
    assert read_manifest(art) == manifest and manifest.iteration == 10 and list(manifest.components) == ["model"]
    comp = manifest.components["model"]
    data = (art / "model.pt").read_bytes()
    assert comp.size == len(data) and comp.sha256 == hashlib.sha256(data).hexdigest()
    loaded = torch.load(art / "model.pt", weights_only=True)
    assert set(loaded) == {"net"}
    for k, v in model.state_dict().items():
        assert torch.equal(loaded["net"][k], v)


def test_full_plan_writes_dcp_optimizer_and_trainer_state(tmp_path):
    model, optim = tiny_training(steps=3)
    manifest = write_artifact(tmp_path, 30, {"model": model, "optimizer": optim, "trainer_state": {"optimizer_step": 3}})
    art = artifact_dir_for(tmp_path, 30)
    assert sorted(manifest.components) == ["model", "optim", "trainer"]
    assert manifest.components["optim"].format == "dcp"
    assert {f.path for f in manifest.components["optim"].files} >= {".metadata"}
    for f in manifest.physical_files():
        data = (art / f.path).read_bytes()
        assert (f.size, f.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert torch.load(art / "trainer.pt", weights_only=True) == {"optimizer_step": 3, "iter": 30}
    # The optimizer state reads back through DCP, keyed by parameter name.
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    target = {"optim": get_optimizer_state_dict(model, optim)}
    expected = {k: v.clone() for k, v in target["optim"]["state"]["0.weight"].items()}
    for v in target["optim"]["state"]["0.weight"].values():
        v.zero_()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.load(target, checkpoint_id=str(art / "optim"))
    for k, v in expected.items():
        assert torch.equal(target["optim"]["state"]["0.weight"][k], v)


def test_model_pt_is_hashed_while_written_not_read_back(tmp_path, monkeypatch):
    written = []
    original = HashingWriter.write

    def counting(self, data):
        written.append(len(data))
        return original(self, data)

    monkeypatch.setattr(HashingWriter, "write", counting)
    import ckptflow.digest as digest

    monkeypatch.setattr(digest, "sha256_file", lambda *a, **k: pytest.fail("model.pt was read back to hash it"))
    model, _ = tiny_training()
    manifest = write_artifact(tmp_path, 1, {"model": model})
    assert sum(written) == manifest.components["model"].size > 0


def test_only_buffers_inside_the_saved_objects_cpu_tensors_are_hashed_after_their_write():
    from ckptflow.trainer.write import held_tensor_memory

    a, b = torch.arange(1000, dtype=torch.float32), torch.ones(10)
    stable = held_tensor_memory({"net": {"a": a, "view": a[10:20]}, "more": [(b,)], "n": 3})
    assert stable(memoryview(a.numpy())) and stable(memoryview(a[100:200].numpy())) and stable(memoryview(b.numpy()))
    assert not stable(memoryview(torch.arange(1000, dtype=torch.float32).numpy()))  # a copy of a: other memory
    assert not stable(memoryview(bytearray(64))) and not stable(memoryview(b""))
    assert held_tensor_memory({})(memoryview(a.numpy())) is False


def test_model_pt_is_byte_identical_to_torch_save_of_the_same_state(tmp_path):
    model, _ = tiny_training()
    manifest = write_artifact(tmp_path, 1, {"model": model})
    with open(tmp_path / "plain.pt", "wb") as fh:  # a file object: the archive's folder is "archive"
        torch.save({"net": {k: v.detach() for k, v in model.state_dict().items()}}, fh)
    data = (artifact_dir_for(tmp_path, 1) / "model.pt").read_bytes()
    assert data == (tmp_path / "plain.pt").read_bytes()
    assert manifest.components["model"].sha256 == hashlib.sha256(data).hexdigest()


def test_dcp_shards_are_hashed_while_written_not_read_back(tmp_path, monkeypatch):
    import ckptflow.digest as digest

    monkeypatch.setattr(digest, "sha256_file", lambda *a, **k: pytest.fail("a file was read back to hash it"))
    model, optim = tiny_training(steps=3)
    manifest = write_artifact(tmp_path, 3, {"model": model, "optimizer": optim, "trainer_state": {"optimizer_step": 3}})
    art = artifact_dir_for(tmp_path, 3)
    files = manifest.components["optim"].files
    assert {f.path for f in files} >= {".metadata", "__0_0.distcp"}
    for f in files:
        data = (art / "optim" / f.path).read_bytes()
        assert (f.size, f.sha256) == (len(data), hashlib.sha256(data).hexdigest())


def test_a_dcp_file_written_other_than_in_order_is_hashed_again_once_written(tmp_path, monkeypatch):
    from ckptflow.trainer import write

    class Seeking(write._HashedStream):
        def write(self, data):
            self.seek(0, os.SEEK_CUR)  # any use the wrapper does not know
            return super().write(data)

    monkeypatch.setattr(write, "_HashedStream", Seeking)
    model, optim = tiny_training(steps=3)
    manifest = write_artifact(tmp_path, 3, {"model": model, "optimizer": optim})
    art = artifact_dir_for(tmp_path, 3)
    for f in manifest.components["optim"].files:
        data = (art / "optim" / f.path).read_bytes()
        assert (f.size, f.sha256) == (len(data), hashlib.sha256(data).hexdigest())


def test_committed_artifact_is_refused_by_name_and_untouched(tmp_path):
    model, _ = tiny_training()
    write_artifact(tmp_path, 5, {"model": model})
    art = artifact_dir_for(tmp_path, 5)
    before = tree_bytes(art)
    with pytest.raises(Refused, match=r"iter_000005.*committed"):
        write_artifact(tmp_path, 5, {"model": tiny_training(seed=1)[0]})
    assert tree_bytes(art) == before


SAVE = """
import sys, torch
sys.path.insert(0, sys.argv[2])
from trainer_helpers import tiny_training
from ckptflow.trainer import write_artifact
model, optim = tiny_training()
write_artifact(sys.argv[1], 7, {"model": model, "optimizer": optim, "trainer_state": {"optimizer_step": 7}})
"""


def killed_save(run, point):
    """A real save of iteration 7 (full plan) in a subprocess that SIGKILLs itself at ``point``."""
    proc = subprocess.run([sys.executable, "-c", SAVE, str(run), str(Path(__file__).parent)], capture_output=True,
                          text=True, env={**os.environ, "CKPTFLOW_TEST_KILL_AT": point}, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    art = artifact_dir_for(run, 7)
    assert not (art / ".posttrain-checkpoint-artifact.json").exists() and (art / ".save-in-progress").is_file()
    return art


@pytest.mark.parametrize("point", ["trainer-save:writing-model.pt", "trainer-save:rank0-durable-iter7",
                                   "trainer-save:before-trainer-state", "trainer-save:writing-trainer.pt"])
@pytest.mark.slow
def test_a_killed_save_is_discarded_by_its_own_record_and_written_again(tmp_path, point):
    art = killed_save(tmp_path, point)
    model, optim = tiny_training()
    manifest = write_artifact(tmp_path, 7, {"model": model, "optimizer": optim, "trainer_state": {"optimizer_step": 7}})
    assert sorted(p.name for p in art.iterdir()) == [".posttrain-checkpoint-artifact.json", "model.pt", "optim",
                                                     "trainer.pt"]
    assert manifest.components["model"].size == (art / "model.pt").stat().st_size


def test_a_save_still_running_on_this_host_is_not_discarded(tmp_path, monkeypatch):
    model, _ = tiny_training()
    worker, outcome = start_paused(lambda: write_artifact(tmp_path, 7, {"model": model}),
                                   "trainer-save:writing-model.pt", tmp_path / "pause", monkeypatch)
    art = artifact_dir_for(tmp_path, 7)
    before = tree_bytes(art)
    with pytest.raises(Refused, match=r"still running"):
        write_artifact(tmp_path, 7, {"model": model})
    assert tree_bytes(art) == before
    resume(worker, tmp_path / "pause", monkeypatch)
    assert "error" not in outcome and (art / ".posttrain-checkpoint-artifact.json").is_file()


def test_a_save_that_failed_in_this_process_is_discarded_by_its_next_save_of_that_iteration(tmp_path):
    model, optim = tiny_training()
    with pytest.raises(Exception, match="pickle"):  # the lambda fails torch.save after model.pt and optim/
        write_artifact(tmp_path, 7, {"model": model, "optimizer": optim,
                                     "trainer_state": {"optimizer_step": 7, "hook": lambda: None}})
    art = artifact_dir_for(tmp_path, 7)
    assert (art / ".save-in-progress").is_file() and (art / "model.pt").is_file()
    # The loop catches it, fixes the state and saves again: the failed save has ended, its record proves it.
    manifest = write_artifact(tmp_path, 7, {"model": model, "optimizer": optim, "trainer_state": {"optimizer_step": 7}})
    assert read_manifest(art) == manifest and not (art / ".save-in-progress").exists()


def test_an_unsealed_user_model_without_a_save_record_is_refused_and_kept(tmp_path):
    art = artifact_dir_for(tmp_path, 7)
    (art / "optim").mkdir(parents=True)
    (art / "model.pt").write_bytes(b"the user's model, not sealed yet")
    (art / "optim" / "__0_0.distcp").write_bytes(b"the user's optimizer shard")
    before = tree_bytes(art)
    model, _ = tiny_training()
    with pytest.raises(Refused, match=r"no \.save-in-progress record.*model\.pt, optim"):
        write_artifact(tmp_path, 7, {"model": model})
    assert tree_bytes(art) == before


@pytest.mark.slow
def test_a_users_file_placed_over_a_killed_save_is_refused_by_name_and_kept(tmp_path):
    art = killed_save(tmp_path, "trainer-save:before-trainer-state")
    (art / "model.pt").unlink()
    (art / "model.pt").write_bytes(b"the user's own model, put where the killed save was")
    (art / "trainer.pt").write_bytes(b"the user's trainer state")
    before = tree_bytes(art)
    model, _ = tiny_training()
    with pytest.raises(Refused, match=r"model\.pt, trainer\.pt"):
        write_artifact(tmp_path, 7, {"model": model})
    assert tree_bytes(art) == before


@pytest.mark.slow
def test_a_users_file_inside_the_dcp_directory_of_a_killed_save_is_refused_and_kept(tmp_path):
    art = killed_save(tmp_path, "trainer-save:rank0-durable-iter7")  # the shards are there, not yet recorded
    assert (art / "optim" / "__0_0.distcp").is_file()
    (art / "optim" / "notes.txt").write_bytes(b"not a shard DCP writes")
    before = tree_bytes(art)
    model, _ = tiny_training()
    with pytest.raises(Refused, match=r"optim/notes\.txt"):
        write_artifact(tmp_path, 7, {"model": model})
    assert tree_bytes(art) == before


def test_an_interrupted_save_beside_a_users_file_is_refused_and_both_survive(tmp_path):
    art = artifact_dir_for(tmp_path, 7)
    art.mkdir(parents=True)
    (art / "model.pt").write_bytes(b"half a file")
    (art / "NOTES.md").write_bytes(b"eval results, not the trainer's")
    before = tree_bytes(art)
    model, _ = tiny_training()
    with pytest.raises(Refused, match=r"NOTES\.md"):
        write_artifact(tmp_path, 7, {"model": model})
    assert tree_bytes(art) == before


@pytest.mark.parametrize("plan", [{}, {"optimizer": 1}, {"model": 1, "trainer_state": 1}, {"model": 1, "bogus": 1}])
def test_plans_other_than_a_prefix_are_usage_errors(tmp_path, plan):
    with pytest.raises(UsageError, match="component plan"):
        write_artifact(tmp_path, 1, plan)
    assert not (tmp_path / "checkpoint_artifacts").exists()


def test_trainer_state_needs_optimizer_step(tmp_path):
    model, optim = tiny_training()
    with pytest.raises(UsageError, match="optimizer_step"):
        write_artifact(tmp_path, 2, {"model": model, "optimizer": optim, "trainer_state": {"iter": 2}})
    assert not (artifact_dir_for(tmp_path, 2) / ".posttrain-checkpoint-artifact.json").exists()
