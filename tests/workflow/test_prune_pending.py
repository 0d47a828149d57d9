"""`snakemake prune_all`: a kept artifact whose local bytes are in no archive fails the job by name, and a
restore (by the workflow or by `ckptflow restore`) makes the artifact's prune pending again."""

from __future__ import annotations

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


PRUNED = [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded"]


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
