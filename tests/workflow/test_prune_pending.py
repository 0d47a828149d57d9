"""`snakemake prune_all`: a kept artifact whose local bytes are in no archive fails the job by name, and a
restore (by the workflow or by `ckptflow restore`) makes the artifact's prune pending again."""

from __future__ import annotations

import pytest
from workflow_helpers import RUN, Flow

from helpers.artifacts import make_artifact

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
