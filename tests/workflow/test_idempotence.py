"""A second run does nothing; unrelated files do not rerun; pruned artifacts are not republished;
a legacy plain-text .uploaded is never counted as published and verified."""

from __future__ import annotations

import json

import pytest
from workflow_helpers import RUN, Flow

from ckptflow.fsutil import walk_files
from helpers.artifacts import make_artifact

TARGETS = ("publish_all", "verify_all", "prune_all")


@pytest.mark.slow
def test_after_success_every_target_has_nothing_to_do_and_unrelated_files_rerun_nothing(tmp_path, kit):
    archive = tmp_path / "arch"
    archive.mkdir()
    flow = Flow(tmp_path / "flow", {
        "base": str(kit.base), "run": RUN, "bucket": f"file://{archive}", "materialize": {"min_tensors": 1},
        "merge": {"300": {"mode": "avg", "experts": [str(p) for p in kit.experts[:2]]}}})
    flow.ok("merge_experts", iter=300)
    flow.ok("prune_all")
    flow.ok("materialize_teacher", iter=300)  # from the archive: the payload was pruned
    art = flow.artifact()
    assert "model.pt" not in list(walk_files(art))
    flow.nothing_planned(*TARGETS)
    flow.nothing_planned("merge_experts", "materialize_teacher", iter=300)

    (art / "NOTES.md").write_text("an operator's note\n", encoding="utf-8")
    (art.parent.parent / "train.log").write_text("unrelated\n", encoding="utf-8")
    (flow.root / "reports" / "other.json").write_text("{}", encoding="utf-8")
    (flow.staged().parent / "scratch.txt").write_text("unrelated\n", encoding="utf-8")
    flow.nothing_planned(*TARGETS)
    flow.nothing_planned("merge_experts", "materialize_teacher", iter=300)
    # Published and pruned: not republished, whatever the bucket is spelled like now.
    assert flow.planned("publish_all", bucket=f"file://{archive}/") == []


def _legacy(tmp_path) -> tuple[Flow, object]:
    archive = tmp_path / "arch"
    archive.mkdir()
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{archive}"})
    art = make_artifact(flow.runs / RUN, iteration=300)
    (art / "optim.pt").unlink()  # an unselected file would (rightly) block pruning
    (art / ".uploaded").write_text("uploaded 2024-05-01 by sync.sh\n", encoding="utf-8")
    return flow, art


@pytest.mark.slow
def test_a_legacy_receipt_is_pending_publication_for_every_target(tmp_path):
    flow, _ = _legacy(tmp_path)
    assert flow.planned("publish_all") == ["replace_legacy_receipt", "publish_all"]
    for target in ("verify_all", "prune_all"):
        plan = flow.planned(target)
        assert plan[0] == "replace_legacy_receipt" and "verify" in plan, (target, plan)
    assert "legacy-receipt" in flow.ok("-n", "publish_all")


@pytest.mark.slow
def test_a_legacy_receipt_is_replaced_by_publication_before_verify_and_prune_pass(tmp_path):
    flow, art = _legacy(tmp_path)
    flow.ok("verify_all")
    receipt = json.loads((art / ".uploaded").read_text())  # JSON now: a receipt bound to the archive
    assert receipt["protocol"] == "posttrain.archive-marker.v1"
    assert json.loads(flow.report("verify").read_text())["status"] == "verified"
    flow.nothing_planned("publish_all", "verify_all")
    flow.ok("prune_all")
    assert sorted(walk_files(art)) == [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded", ".verified.json"]
    flow.nothing_planned(*TARGETS)
