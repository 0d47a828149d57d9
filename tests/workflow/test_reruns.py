"""Snakemake deletes a rule's declared output before a rerun and after a failure: that never costs state.

For each of merge, fetch and materialize, three reruns: after a params change, after a code change
(``--forcerun``), after a failed job (the step process killed with SIGKILL at a named point). The
library's records are not rule outputs, so the rerun finds them and decides as the CLI would.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import pytest
from workflow_helpers import RUN, Flow, Snapshot

from ckptflow.archive.publish import publish_artifact
from ckptflow.store.open import open_bucket_arg
from helpers.artifacts import make_artifact
from helpers.trees import tree_state

pytestmark = pytest.mark.slow


def _merged(tmp_path, kit, **config) -> Flow:
    flow = Flow(tmp_path, {
        "base": str(kit.base), "run": RUN, "materialize": {"min_tensors": 1},
        "merge": {"300": {"mode": "tv", "experts": [str(p) for p in kit.experts], "lam": 0.5}}, **config})
    flow.ok("merge_experts", iter=300)
    return flow


def _set_recipe(flow: Flow, **changes) -> None:
    flow.config["merge"] = {"300": {**flow.config["merge"]["300"], **changes}}


# The merge (and its teacher) most tests here start from, built once: these tests run one after another on
# one worker (an xdist group), each from its own copy of the state (Snapshot.restore).
STATES_GROUP = "reruns-merged-and-taught"


@dataclass(frozen=True)
class States:
    merged: Snapshot  # merge_experts done (tv over the three experts)
    taught: Snapshot  # and then materialize_teacher done, from the local artifact


@pytest.fixture(scope="session")
def states(tmp_path_factory: pytest.TempPathFactory, kit) -> States:
    base = tmp_path_factory.mktemp("reruns")
    flow = _merged(base / "work", kit)
    merged = Snapshot.take(flow, base / "merged")
    flow.ok("materialize_teacher", iter=300)
    return States(merged, Snapshot.take(flow, base / "taught"))


# --------------------------------------------------------------------------------------------- merge


@pytest.mark.xdist_group(STATES_GROUP)
def test_merge_rerun_after_a_params_change_refuses_to_replace_another_request_without_force(states):
    flow = states.merged.restore()
    before = tree_state(flow.artifact())
    _set_recipe(flow, lam=0.7)
    assert flow.planned("merge_experts", iter=300) == ["merge", "merge_experts"]
    out = flow.fails("merge_experts", iter=300)
    assert "force" in out + flow.log_of("merge")
    assert tree_state(flow.artifact()) == before and not flow.report("merge").exists()
    _set_recipe(flow, force=True)
    flow.ok("merge_experts", iter=300)
    report = json.loads(flow.report("merge").read_text())
    assert report["status"] == "built" and report["lam"] == 0.7 and report["replaced_identity"]


@pytest.mark.xdist_group(STATES_GROUP)
def test_merge_rerun_after_a_code_change_skips_the_same_request(states):
    flow = states.merged.restore()
    before = tree_state(flow.artifact())
    out = flow.ok("merge_experts", "--forcerun", "merge", iter=300)
    assert "rule merge:" in out
    assert json.loads(flow.report("merge").read_text())["status"] == "skipped"
    assert tree_state(flow.artifact()) == before


@pytest.mark.xdist_group(STATES_GROUP)
def test_merge_rerun_after_a_failed_job_keeps_the_completed_merge(states):
    flow = states.merged.restore()
    committed = {k: v for k, v in tree_state(flow.artifact()).items() if k != ""}
    _set_recipe(flow, lam=0.7, force=True)
    flow.fails("merge_experts", iter=300, kill_at="merge:after-model-write")
    assert not flow.report("merge").exists()  # Snakemake removed the failed job's output
    now = tree_state(flow.artifact())
    assert all(now.get(k) == v for k, v in committed.items() if v[0] == "file"), "a committed file changed"
    _set_recipe(flow, lam=0.5, force=False)  # back to the completed request: found, not rebuilt
    flow.ok("merge_experts", iter=300)
    assert json.loads(flow.report("merge").read_text())["status"] == "skipped"
    now = tree_state(flow.artifact())
    assert {k: now.get(k) for k in committed} == committed
    # The killed job's temporary is the merge's own: the next build removes it (a skip leaves it be).
    _set_recipe(flow, lam=0.7, force=True)
    flow.ok("merge_experts", iter=300)
    report = json.loads(flow.report("merge").read_text())
    assert report["status"] == "built" and report["lam"] == 0.7
    assert sorted(tree_state(flow.artifact())) == sorted(committed)


def test_merge_rerun_after_the_merge_was_published_and_pruned_skips_and_rewrites_its_report(tmp_path, kit):
    archive = tmp_path / "arch"
    archive.mkdir()
    flow = _merged(tmp_path / "flow", kit, bucket=f"file://{archive}")
    flow.ok("prune_all")
    assert not (flow.artifact() / "model.pt").exists()
    before = tree_state(flow.artifact())
    out = flow.ok("merge_experts", "-F", iter=300)  # Snakemake deletes the merge report first
    assert "rule merge:" in out
    report = json.loads(flow.report("merge").read_text())
    assert report["status"] == "skipped" and "pruned" in report["reason"]
    assert tree_state(flow.artifact()) == before
    assert flow.planned("merge_experts", iter=300) == []
    assert flow.planned("prune_all") == []


# --------------------------------------------------------------------------------------------- fetch


def _archived(tmp_path, name: str, seed: int) -> str:
    """A file:// archive holding RUN's iteration 300 (random payloads: fetch does not read them)."""
    art = make_artifact(tmp_path / f"src-{name}", iteration=300, seed=seed)
    (art / "optim.pt").unlink()
    archive = tmp_path / name
    archive.mkdir()
    publish_artifact(art, open_bucket_arg(f"file://{archive}", None), f"{RUN}/checkpoints", progress=False)
    return f"file://{archive}"


def _fetch_flow(tmp_path) -> tuple[Flow, str]:
    flow = Flow(tmp_path / "flow", {"bucket": _archived(tmp_path, "arch-a", 0), "run": RUN})
    return flow, str(flow.report("fetch"))


def test_fetch_rerun_after_a_params_change_replaces_its_own_copy_not_a_foreign_one(tmp_path):
    flow, target = _fetch_flow(tmp_path)
    flow.ok(target)
    assert json.loads(flow.report("fetch").read_text())["status"] == "fetched"
    flow.config["bucket"] = _archived(tmp_path, "arch-b", 1)  # the artifact's URI changes
    assert flow.planned(target) == ["fetch"]
    flow.ok(target)
    report = json.loads(flow.report("fetch").read_text())
    assert report["status"] == "replaced" and report["source_uri"].startswith(flow.config["bucket"])
    assert json.loads((flow.staged() / ".staged.json").read_text())["source_uri"] == report["source_uri"]


def test_fetch_rerun_after_a_code_change_finds_its_own_complete_copy(tmp_path):
    flow, target = _fetch_flow(tmp_path)
    flow.ok(target)
    before = tree_state(flow.staged())
    flow.ok(target, "--forcerun", "fetch")
    assert json.loads(flow.report("fetch").read_text())["status"] == "already-staged"
    assert tree_state(flow.staged()) == before


def test_fetch_rerun_after_a_failed_job_resumes_its_own_partial_copy(tmp_path):
    flow, target = _fetch_flow(tmp_path)
    flow.fails(target, kill_at="fetch:before-manifest")
    assert not flow.report("fetch").exists()
    assert json.loads((flow.staged() / ".staged.json").read_text())["complete"] is False
    flow.ok(target)
    report = json.loads(flow.report("fetch").read_text())
    assert report["status"] == "resumed" and report["downloaded"] == []


# --------------------------------------------------------------------------------------------- materialize


@pytest.mark.xdist_group(STATES_GROUP)
def test_materialize_rerun_after_a_params_change_skips_the_same_identity_and_refuses_another(states, tmp_path, kit):
    flow = states.taught.restore()
    before = tree_state(flow.teacher())
    flow.config["materialize"] = {"min_tensors": 2}  # not part of the identity
    flow.ok("materialize_teacher", iter=300)
    assert json.loads(flow.report("materialize").read_text())["status"] == "skipped"
    other_base = shutil.copytree(kit.base, tmp_path / "other-base")
    config = json.loads((other_base / "config.json").read_text())
    (other_base / "config.json").write_text(json.dumps({**config, "note": "another base"}, indent=2))
    flow.config["base"] = str(other_base)  # another identity: refused without force
    out = flow.fails("materialize_teacher", iter=300)
    assert "force" in out + flow.log_of("materialize")
    assert tree_state(flow.teacher()) == before


@pytest.mark.xdist_group(STATES_GROUP)
def test_materialize_rerun_after_a_code_change_skips(states):
    flow = states.taught.restore()
    before = tree_state(flow.teacher())
    flow.ok("materialize_teacher", "--forcerun", "materialize", iter=300)
    assert json.loads(flow.report("materialize").read_text())["status"] == "skipped"
    assert tree_state(flow.teacher()) == before


@pytest.mark.xdist_group(STATES_GROUP)
def test_materialize_rerun_after_a_failed_job_keeps_the_teacher(states):
    flow = states.taught.restore()
    before = tree_state(flow.teacher())
    flow.config["materialize"] = {"min_tensors": 1, "force": True}
    flow.fails("materialize_teacher", iter=300, kill_at="materialize:after-convert")
    assert not flow.report("materialize").exists()
    assert tree_state(flow.teacher()) == before
    flow.config["materialize"] = {"min_tensors": 1}
    flow.ok("materialize_teacher", iter=300)
    assert json.loads(flow.report("materialize").read_text())["status"] == "skipped"
    assert tree_state(flow.teacher()) == before
