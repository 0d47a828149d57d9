"""merge_experts and materialize_teacher end to end: Snakemake as a subprocess, tiny real models."""

from __future__ import annotations

import json
import shutil

import pytest
from workflow_helpers import RUN, Flow

from ckptflow.archive.publish import publish_artifact
from ckptflow.fsutil import walk_files
from ckptflow.store.open import open_bucket_arg
from helpers.artifacts import make_artifact, make_trained_artifact
from helpers.cli import run_cli


def _flow(tmp_path, kit, **config) -> Flow:
    return Flow(tmp_path, {
        "base": str(kit.base), "run": RUN,
        "merge": {"300": {"mode": "tv", "experts": [str(p) for p in kit.experts], "lam": 0.5}},
        "materialize": {"min_tensors": 1}, **config})


@pytest.mark.slow
def test_merge_then_teacher_from_the_local_artifact_then_nothing_to_do(tmp_path, kit):
    flow = _flow(tmp_path, kit)
    assert flow.planned("materialize_teacher", iter=300) == ["merge", "materialize", "materialize_teacher"]
    flow.ok("materialize_teacher", iter=300)
    art = flow.artifact()
    assert json.loads((art / ".merge-complete.json").read_text())["request"]["lam"] == 0.5
    report = json.loads(flow.report("materialize").read_text())
    assert report["status"] == "built" and report["source"]["location"] == str(art)
    assert (flow.teacher() / ".materialized").is_file() and not flow.staged().exists()
    # Once the artifact exists, run may be omitted: the one run holding iteration 300 is used.
    flow.config["run"] = None
    assert flow.planned("materialize_teacher", iter=300) == []
    assert flow.planned("merge_experts", iter="iter_000300") == []


@pytest.mark.slow
def test_a_pruned_artifact_materializes_from_the_archive_its_receipt_names(
        tmp_path, kit, seaweedfs_bucket, seaweedfs_credentials_path):
    flow = _flow(tmp_path, kit, bucket=seaweedfs_bucket, credentials=str(seaweedfs_credentials_path))
    flow.ok("merge_experts", iter=300)
    flow.ok("prune_all")
    art = flow.artifact()
    assert "model.pt" not in list(walk_files(art))
    # No fetch job first: materialize decides on the teacher, then fetches what a build needs.
    assert flow.planned("materialize_teacher", iter=300) == ["materialize", "materialize_teacher"]
    flow.ok("materialize_teacher", iter=300)
    built = json.loads(flow.report("materialize").read_text())
    uri = f"s3://{seaweedfs_bucket}/{RUN}/checkpoint_artifacts/iter_000300"
    fetched = built["fetch"]
    assert fetched["status"] == "fetched" and fetched["path"] == str(flow.staged())
    assert (flow.staged() / ".staged.json").is_file()
    assert json.loads((flow.staged() / ".staged.json").read_text())["source_uri"] == uri
    assert built["status"] == "built" and built["source"]["kind"] == "artifact-uri" and built["source"]["location"] == uri
    # The teacher records the archive's identity, although its bytes came through the fetch rule's stage.
    assert json.loads((flow.teacher() / ".materialized").read_text())["source"]["uri"] == uri
    assert (flow.staged() / ".staged.json").is_file()  # the fetch rule's stage is kept, not removed
    assert flow.planned("materialize_teacher", iter=300) == []
    flow.nothing_planned("prune_all", "publish_all")


@pytest.mark.slow
def test_without_a_local_directory_the_teacher_is_fetched_from_the_bucket(
        tmp_path, kit, seaweedfs_bucket, seaweedfs_credentials_path):
    flow = _flow(tmp_path, kit, bucket=f"s3://{seaweedfs_bucket}", credentials=str(seaweedfs_credentials_path),
                 merge={})
    src = _flow(tmp_path / "elsewhere", kit)
    src.ok("merge_experts", iter=300)
    publish_artifact(src.artifact(), open_bucket_arg(seaweedfs_bucket, str(seaweedfs_credentials_path)),
                     f"{RUN}/checkpoints", progress=False)
    assert not flow.runs.exists()
    flow.ok("materialize_teacher", iter=300)
    built = json.loads(flow.report("materialize").read_text())
    assert built["source"]["location"] == f"s3://{seaweedfs_bucket}/{RUN}/checkpoint_artifacts/iter_000300"
    assert built["status"] == "built" and built["fetch"]["status"] == "fetched"
    assert not flow.runs.exists()  # nothing was written where the artifact would live


@pytest.mark.slow
def test_after_prune_all_an_intact_teacher_is_skipped_without_downloading_anything(
        tmp_path, kit, seaweedfs_bucket, seaweedfs_credentials_path):
    flow = _flow(tmp_path, kit, bucket=seaweedfs_bucket, credentials=str(seaweedfs_credentials_path))
    flow.ok("materialize_teacher", iter=300)
    assert json.loads(flow.report("materialize").read_text())["status"] == "built"
    teacher = {p: (flow.teacher() / p).read_bytes() for p in walk_files(flow.teacher())}
    flow.ok("prune_all")
    assert "model.pt" not in list(walk_files(flow.artifact()))
    assert flow.planned("materialize_teacher", iter=300) == ["materialize", "materialize_teacher"]
    flow.ok("materialize_teacher", iter=300)
    report = json.loads(flow.report("materialize").read_text())
    assert report["status"] == "skipped" and report["source"]["kind"] == "artifact-uri"
    assert report["fetch"] is None and report["staging"] is None
    assert not flow.staged().exists() and not flow.report("fetch").exists()  # 0 bytes downloaded, nothing staged
    assert {p: (flow.teacher() / p).read_bytes() for p in walk_files(flow.teacher())} == teacher


@pytest.mark.slow
def test_a_missing_iteration_or_an_ambiguous_run_is_a_clear_error(tmp_path):
    flow = Flow(tmp_path)
    assert "--config iter=300" in flow.fails("-n", "materialize_teacher")
    for run in ("p/g/a/ts", "p/g/b/ts"):
        make_artifact(flow.runs / run, iteration=300)
    out = flow.fails("-n", "materialize_teacher", iter=300)
    assert "p/g/a/ts" in out and "p/g/b/ts" in out and "--config run=" in out
    assert "no recipe for iteration 300" in flow.fails("-n", "merge_experts", iter=300, run="p/g/a/ts")
    shutil.rmtree(flow.runs)
    assert "--config run=" in flow.fails("-n", "materialize_teacher", iter=300)


@pytest.mark.slow
def test_a_teacher_built_from_the_archive_downloads_only_the_model(
        tmp_path, kit, seaweedfs_bucket, seaweedfs_credentials_path):
    """A trainer's artifact (model, optimizer and trainer state) published and pruned: the teacher's build
    downloads model.pt alone, the stage records that it holds the model only, and status says so."""
    flow = _flow(tmp_path, kit, bucket=seaweedfs_bucket, credentials=str(seaweedfs_credentials_path), merge={})
    art = make_trained_artifact(flow.runs / RUN, kit.experts[0])
    sizes = {p: (art / p).stat().st_size for p in walk_files(art) if not p.startswith(".")}
    flow.ok("prune_all")
    assert "model.pt" not in list(walk_files(art))
    flow.ok("materialize_teacher", iter=300)
    built = json.loads(flow.report("materialize").read_text())
    assert built["status"] == "built" and built["source"]["kind"] == "artifact-uri"
    assert built["fetch"]["downloaded"] == ["model.pt"] and built["fetch"]["downloaded_bytes"] == sizes["model.pt"]
    assert sorted(walk_files(flow.staged())) == [".posttrain-checkpoint-artifact.json", ".staged.json", "model.pt"]
    assert json.loads((flow.staged() / ".staged.json").read_text())["components"] == ["model"]
    status = run_cli("status", str(flow.runs), "--stage-dir", flow.config["stage_dir"], "--json")
    [row] = status.report["rows"]
    assert row["staged"]["state"] == "staged" and row["staged"]["components"] == ["model"]
    assert flow.planned("materialize_teacher", iter=300) == []
