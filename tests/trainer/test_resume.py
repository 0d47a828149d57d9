"""The resume guard: no cold restart over a committed artifact, one test per rule."""

from __future__ import annotations

import pytest
import torch
from trainer_helpers import tiny_training

from ckptflow.archive.probe import run_probe
from ckptflow.archive.prune import prune_verified
from ckptflow.archive.publish import publish_artifact
from ckptflow.commands.summary import render
from ckptflow.errors import Refused
from ckptflow.fsutil import walk_files
from ckptflow.jsonio import validate
from ckptflow.store.local import LocalStore
from ckptflow.trainer.resume import check_run_attempt, pin_run_attempt
from ckptflow.trainer.write import write_artifact
from helpers.artifacts import UPLOAD_PREFIX
from helpers.cli import run_cli
from helpers.trees import tree_bytes


@pytest.fixture(scope="module")
def model():
    return tiny_training(steps=1)


def artifact(attempt, it, model, full=False):
    net, optim = model
    comps = {"model": net, "optimizer": optim, "trainer_state": {"optimizer_step": it}} if full else {"model": net}
    write_artifact(attempt, it, comps)
    return attempt / "checkpoint_artifacts" / f"iter_{it:06d}"


def checkpoint(attempt, it, **state):
    d = attempt / "checkpoints" / f"iter_{it:07d}"
    d.mkdir(parents=True)
    torch.save(state or {"optimizer_step": it, "iter": it}, d / "trainer.pt")
    (d / "model.pt").write_bytes(b"m")
    return d


def assert_refusal_names_the_remedies(text, attempt):
    assert str(attempt) in text
    assert "new job name" in text and "data cursor" in text and "fresh optimizer state" in text
    assert "resume=off" in text and "fresh attempt beside" in text
    assert "full component plan" in text


def test_fresh_attempt_and_interrupted_artifact_are_unaffected(tmp_path):
    assert check_run_attempt(tmp_path / "new").decision == "fresh"
    interrupted = tmp_path / "a" / "checkpoint_artifacts" / "iter_000010"
    interrupted.mkdir(parents=True)
    (interrupted / "model.pt").write_bytes(b"half")
    d = pin_run_attempt(tmp_path / "a")
    assert d.decision == "fresh" and d.newest_artifact is None


def test_step0_restart_over_a_committed_artifact_is_refused_and_nothing_touched(tmp_path, model):
    attempt = tmp_path / "run" / "ts"
    artifact(attempt, 10, model)
    before = tree_bytes(tmp_path)
    with pytest.raises(Refused) as exc:
        pin_run_attempt(attempt)
    assert "step-0 restart" in str(exc.value) and "iter_000010" in str(exc.value)
    assert_refusal_names_the_remedies(str(exc.value), attempt)
    assert tree_bytes(tmp_path) == before


def test_auto_never_resumes_from_a_model_only_artifact(tmp_path, model):
    attempt = tmp_path / "ts"
    art = artifact(attempt, 10, model)
    d = check_run_attempt(attempt, "auto", art)
    assert d.decision == "refused" and "model-only" in d.reason
    # A model-only artifact of another attempt is no resume point either.
    d = check_run_attempt(tmp_path / "other", "auto", art)
    assert d.decision == "refused" and "model-only" in d.reason
    # The full component plan is resumable.
    full = artifact(attempt, 20, model, full=True)
    d = check_run_attempt(attempt)
    assert d.decision == "resume" and d.resume_from == str(full) and d.resume_iteration == 20


@pytest.mark.parametrize("ckpt_it", [10, 15])
def test_full_checkpoint_at_or_after_the_newest_artifact_resumes(tmp_path, model, ckpt_it):
    attempt = tmp_path / "ts"
    artifact(attempt, 5, model)
    artifact(attempt, 10, model)
    checkpoint(attempt, 3)
    ckpt = checkpoint(attempt, ckpt_it)
    d = pin_run_attempt(attempt)
    assert d.decision == "resume" and d.resume_from == str(ckpt) and d.resume_iteration == ckpt_it


def test_full_checkpoint_behind_the_newest_artifact_is_refused(tmp_path, model):
    attempt = tmp_path / "ts"
    checkpoint(attempt, 8)
    artifact(attempt, 10, model)
    d = check_run_attempt(attempt)
    assert d.decision == "refused" and "behind" in d.reason and "iter_0000008" in d.reason
    assert_refusal_names_the_remedies(d.message(), attempt)


def test_explicit_path_without_iter_segment_is_placed_by_its_trainer_state(tmp_path, model):
    attempt = tmp_path / "ts"
    artifact(attempt, 10, model)
    legacy = tmp_path / "legacy" / "last"
    legacy.mkdir(parents=True)
    torch.save({"optimizer_step": 12, "iter": 12}, legacy / "trainer.pt")
    d = check_run_attempt(attempt, "auto", legacy)
    assert d.decision == "resume" and d.resume_iteration == 12 and "trainer.pt" in d.reason
    single = tmp_path / "legacy" / "final.pt"
    torch.save({"optimizer_step": 11, "net": {}}, single)  # top level of a single-file checkpoint
    assert check_run_attempt(attempt, "auto", single).resume_iteration == 11
    behind = tmp_path / "legacy" / "old.pt"
    torch.save({"iter": 9}, behind)
    d = check_run_attempt(attempt, "auto", behind)
    assert d.decision == "refused" and "behind" in d.reason


class NotAWeight:
    pass


@pytest.mark.parametrize("content", [{"net": {}}, {"iter": "12"}, {"iter": -1}, [12], "unsafe"])
def test_explicit_path_whose_iteration_cannot_be_established_is_refused(tmp_path, model, content):
    attempt = tmp_path / "ts"
    artifact(attempt, 10, model)
    path = tmp_path / "ckpt.pt"
    torch.save(NotAWeight() if content == "unsafe" else content, path)  # weights_only refuses the class
    d = check_run_attempt(attempt, "auto", path)
    assert d.decision == "refused" and "cannot be established" in d.reason
    assert check_run_attempt(attempt, "auto", tmp_path / "missing").decision == "refused"


def test_resume_off_mints_a_fresh_attempt_beside_the_original(tmp_path, model):
    attempt = tmp_path / "run" / "ts"
    artifact(attempt, 10, model)
    before = tree_bytes(attempt)
    d = pin_run_attempt(attempt, "off")
    assert d.decision == "fresh" and d.attempt_dir != str(attempt)
    new = tmp_path / "run" / d.attempt_dir.rsplit("/", 1)[1]
    assert new.is_dir() and not any(new.iterdir()) and tree_bytes(attempt) == before
    assert check_run_attempt(tmp_path / "empty", "off").attempt_dir == str(tmp_path / "empty")


@pytest.mark.slow
def test_command_exit_codes_reports_and_summaries(tmp_path, model):
    attempt = tmp_path / "ts"
    attempt.mkdir()  # an attempt directory that does not exist is an error (tests/test_cli_errors.py)
    proc = run_cli("resume-check", "--attempt-dir", str(attempt))
    assert proc.returncode == 0 and proc.report["decision"] == "fresh"
    validate(proc.report, "report_resume_check", what="resume-check report")
    artifact(attempt, 10, model)
    proc = run_cli("resume-check", "--attempt-dir", str(attempt), "--resume", "auto")
    assert proc.returncode == 1 and proc.report["status"] == "refused"
    validate(proc.report, "report_resume_check", what="resume-check report")
    assert len(proc.report["remedies"]) == 3
    assert_refusal_names_the_remedies(proc.stderr, attempt)
    assert_refusal_names_the_remedies(render("resume-check", proc.report, 0.1), attempt)
    ckpt = checkpoint(attempt, 10)
    proc = run_cli("resume-check", "--attempt-dir", str(attempt), "--resume-path", str(ckpt))
    assert proc.returncode == 0 and proc.report["resume_from"] == str(ckpt)
    assert str(ckpt) in render("resume-check", proc.report, None)


@pytest.mark.slow
def test_a_pruned_resume_point_is_refused_by_both_paths_naming_restore(tmp_path, model):
    """A full-plan artifact published and pruned (its manifest and receipt left) is no resume point until it
    is restored, whether the guard finds it (--attempt-dir) or is given it (--resume-path); a complete
    checkpoint of the same iteration still is one."""
    attempt = tmp_path / "proj" / "group" / "run1" / "20261129T000000Z"
    art = artifact(attempt, 20, model, full=True)
    store = LocalStore(tmp_path / "archive")
    store.root.mkdir()
    assert run_probe(store, "scratch").record.passed
    publish_artifact(art, store, UPLOAD_PREFIX, progress=False)
    assert prune_verified([art], lambda destination: store).removed
    assert sorted(walk_files(art)) == [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded"]
    before = tree_bytes(tmp_path)
    for extra in ((), ("--resume-path", str(art))):
        proc = run_cli("resume-check", "--attempt-dir", str(attempt), *extra)
        assert proc.returncode == 1 and proc.report["decision"] == "refused", proc.stdout
        assert str(art) in proc.report["reason"] and "pruned" in proc.report["reason"]
        assert f"ckptflow restore --artifact-dir {art}" in proc.report["remedies"][0]
        assert "snakemake restore --config iter=20" in proc.report["remedies"][0]
    assert tree_bytes(tmp_path) == before
    ckpt = checkpoint(attempt, 20)
    d = check_run_attempt(attempt)
    assert d.decision == "resume" and d.resume_from == str(ckpt)


@pytest.mark.parametrize("archived", [True, False], ids=["archived", "not-yet-archived"])
def test_a_resume_point_rewritten_in_place_is_refused_as_damaged_by_both_paths_naming_the_remedy(tmp_path, model, archived):
    """A full-plan artifact whose trainer state was truncated and rewritten in place after its commit (same
    size, other bytes) is no resume point: the guard names it damaged, and the remedy fits whether an archive
    holds its committed bytes or not."""
    attempt = tmp_path / "proj" / "group" / "run" / "ts"
    art = artifact(attempt, 20, model, full=True)
    if archived:
        store = LocalStore(tmp_path / "archive")
        store.root.mkdir()
        publish_artifact(art, store, UPLOAD_PREFIX, progress=False)
    path = art / "trainer.pt"
    data = path.read_bytes()
    torch.save({"optimizer_step": 21}, tmp_path / "other.pt")
    other = (tmp_path / "other.pt").read_bytes()
    with open(path, "wb") as fh:  # truncates the committed inode, then writes other bytes of the same size
        fh.write(other[: len(data)].ljust(len(data), b"\0"))
    assert path.stat().st_size == len(data)

    for extra in ((), ("--resume-path", str(art))):
        proc = run_cli("resume-check", "--attempt-dir", str(attempt), *extra)
        assert proc.returncode == 1 and proc.report["decision"] == "refused", proc.stdout
        assert f"{art} is damaged" in proc.report["reason"] and "trainer.pt was rewritten after the commit" in \
            proc.report["reason"]
        remedy = proc.report["remedies"][0]
        if archived:
            assert f"`ckptflow restore --artifact-dir {art}`" in remedy and "move the changed file(s)" in remedy
        else:
            assert "archived nowhere" in remedy
