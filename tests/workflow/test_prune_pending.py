"""`snakemake prune_all`: a kept artifact whose local bytes are in no archive fails the job by name, and a
restore (by the workflow or by `ckptflow restore`) makes the artifact's prune pending again."""

from __future__ import annotations

import json

import pytest
from workflow_helpers import RUN, Flow

from ckptflow.fsutil import walk_files
from helpers.artifacts import make_artifact
from helpers.cli import run_cli

pytestmark = pytest.mark.slow


def _flow(tmp_path, iterations=(300,)) -> Flow:
    (tmp_path / "archive").mkdir()
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{tmp_path / 'archive'}"})
    for it in iterations:
        art = make_artifact(flow.runs / RUN, iteration=it, seed=it)
        (art / "optim.pt").unlink()  # an unselected file would (rightly) block pruning
    return flow


def test_prune_all_fails_naming_a_payload_rewritten_after_publication_and_keeps_it(tmp_path):
    flow = _flow(tmp_path)
    flow.ok("verify_all")
    model = flow.artifact() / "model.pt"
    with open(model, "r+b") as fh:
        fh.write(b"retrained in place")
    out = flow.fails("prune_all")
    assert f"{flow.artifact()}: local bytes of ['model.pt'] differ from the archived copy" in out
    assert model.read_bytes().startswith(b"retrained in place")


PRUNED = [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded", ".verified.json"]


def test_a_restore_makes_the_prune_of_the_artifact_pending_again(tmp_path):
    """Restored by the workflow's restore target, then by `ckptflow restore`: each time prune_all prunes it again."""
    flow = _flow(tmp_path)
    art = flow.artifact()
    flow.ok("prune_all")
    assert sorted(walk_files(art)) == PRUNED
    flow.nothing_planned("prune_all")
    for restore in (lambda: flow.ok("restore", iter=300),
                    lambda: run_cli("restore", "--artifact-dir", str(art), env=flow.env).check_returncode()):
        restore()
        assert "model.pt" in set(walk_files(art))
        assert flow.planned("prune_all") == ["prune", "prune_all"]
        flow.ok("prune_all")
        assert sorted(walk_files(art)) == PRUNED
        flow.nothing_planned("prune_all")


def test_a_restore_makes_prune_all_with_keep_free_pending_again(tmp_path):
    flow = _flow(tmp_path, iterations=(100, 300))
    flow.config["prune"] = {"keep_free": "100%", "keep_newest": 1}  # never met: every verified one but the newest
    art = flow.artifact(100)
    flow.ok("prune_all")
    assert sorted(walk_files(art)) == PRUNED and "model.pt" in set(walk_files(flow.artifact(300)))
    flow.nothing_planned("prune_all")
    run_cli("restore", "--artifact-dir", str(art), env=flow.env).check_returncode()
    assert flow.planned("prune_all") == ["prune_keep_free", "prune_all"]
    flow.ok("prune_all")
    assert sorted(walk_files(art)) == PRUNED
    flow.nothing_planned("prune_all")


# Whatever freed the payloads before the workflow's prune ran (so that prune removed nothing itself), a
# restore makes the prune pending again and the next prune_all frees them.


def _single_payload_flow(tmp_path) -> Flow:
    """One artifact with one payload file (model.pt): a killed prune's aside is the only copy of its bytes."""
    from ckptflow.artifact import ComponentSpec, seal_artifact

    (tmp_path / "archive").mkdir()
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{tmp_path / 'archive'}"})
    art = flow.artifact()
    art.mkdir(parents=True)
    (art / "model.pt").write_bytes(bytes(range(256)) * 1000)
    seal_artifact(art, 300, [ComponentSpec("model", "model.pt")], progress=False)
    return flow


def _removed_files(flow: Flow) -> list[str]:
    """The payload files the prune report of the flow's artifact says its job removed."""
    return [f for e in json.loads(flow.report("prune").read_bytes())["removed"] for f in e["files"]]


def _restored_then_pruned_again(flow: Flow) -> None:
    art = flow.artifact()
    flow.nothing_planned("prune_all")
    restored = run_cli("restore", "--artifact-dir", str(art), env=flow.env)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "model.pt" in set(walk_files(art))
    assert flow.planned("prune_all") == ["prune", "prune_all"]
    flow.ok("prune_all")
    assert "model.pt" not in set(walk_files(art))
    flow.nothing_planned("prune_all")


def test_a_restore_after_a_hand_prune_makes_the_prune_pending_again(tmp_path):
    flow = _flow(tmp_path)
    flow.ok("verify_all")
    pruned = run_cli("prune-verified", "--paths", str(flow.artifact()), env=flow.env)
    assert pruned.returncode == 0 and pruned.report["removed"], pruned.stdout + pruned.stderr
    flow.ok("prune_all")
    assert _removed_files(flow) == []  # freed before it ran
    _restored_then_pruned_again(flow)


def test_a_restore_after_publish_with_delete_local_makes_the_prune_pending_again(tmp_path):
    flow = _flow(tmp_path)
    published = run_cli("publish", "--artifact-dir", str(flow.artifact()), "--bucket", flow.config["bucket"],
                        "--delete-local", env=flow.env)
    assert published.returncode == 0, published.stdout + published.stderr
    assert "model.pt" not in set(walk_files(flow.artifact()))
    flow.ok("prune_all")
    assert _removed_files(flow) == []
    _restored_then_pruned_again(flow)


def test_a_restore_after_a_killed_prune_batch_whose_rerun_freed_nothing_more_makes_the_prune_pending_again(
        tmp_path):
    flow = _flow(tmp_path)
    flow.ok("verify_all")
    flow.fails("prune_all", kill_at="batch:after-member")  # the payloads freed, the batch's outcomes never written
    assert "model.pt" not in set(walk_files(flow.artifact()))
    flow.ok("prune_all")
    assert _removed_files(flow) == []
    _restored_then_pruned_again(flow)


def test_a_restore_after_a_rerun_prune_freed_a_killed_prunes_aside_makes_the_prune_pending_again(tmp_path):
    flow = _single_payload_flow(tmp_path)
    flow.ok("verify_all")
    flow.fails("prune_all", kill_at="release:after-aside")  # model.pt renamed aside, then killed
    assert "model.pt" not in set(walk_files(flow.artifact()))
    flow.ok("prune_all")
    removed = _removed_files(flow)
    assert len(removed) == 1 and removed != ["model.pt"], removed  # the aside's name, not model.pt
    _restored_then_pruned_again(flow)
