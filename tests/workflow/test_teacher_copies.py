"""materialize_teacher and fetch of a pruned artifact whose receipt lists two copies (published by the
workflow to A, then to B by hand with ``publish --add-destination``, so the receipt names B first; pruned on
A's proof): when B cannot serve (its root unmounted, its model.pt damaged, its credentials missing), A does,
with one warning naming B and why, and the step report names the copy that served."""

from __future__ import annotations

import json

import pytest
from workflow_helpers import RUN, Flow

from ckptflow.fsutil import walk_files
from ckptflow.jsonio import validate
from helpers.artifacts import make_artifact
from helpers.cli import run_cli
from helpers.trees import file_bytes

pytestmark = pytest.mark.slow

ITER = "iter_000300"
# No credentials anywhere: an s3:// copy cannot be opened (a file:// one needs none).
NO_CREDENTIALS = {"CKPTFLOW_CREDENTIALS": "", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
                  "AWS_EC2_METADATA_DISABLED": "true"}


def _two_copies(tmp_path, config: dict, b_bucket: str | None = None, b_credentials=None, *, merge: bool) -> Flow:
    """The flow with its artifact published to ``file://A`` by the workflow, added at B (``file://B`` unless
    ``b_bucket``), then pruned on A's proof."""
    (tmp_path / "A").mkdir()
    if b_bucket is None:
        (tmp_path / "B").mkdir()
        b_bucket = f"file://{tmp_path / 'B'}"
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{tmp_path / 'A'}", "run": RUN, **config})
    if merge:
        flow.ok("merge_experts", iter=300)
    else:
        (make_artifact(flow.runs / RUN) / "optim.pt").unlink()  # an unselected file would block pruning
    art = flow.artifact()
    flow.ok("publish_all")
    creds = ["--credentials", str(b_credentials)] if b_credentials else []
    added = run_cli("publish", "--artifact-dir", str(art), "--bucket", b_bucket, "--add-destination", *creds, env=flow.env)
    assert added.returncode == 0, added.stderr[-2000:]
    pruned = run_cli("prune-verified", "--paths", str(art), "--destination", f"file://{tmp_path / 'A'}", env=flow.env)
    assert pruned.returncode == 0 and not (art / "model.pt").exists(), pruned.stdout + pruned.stderr[-2000:]
    return flow


def _teacher_flow(tmp_path, kit, b_bucket=None, b_credentials=None) -> Flow:
    return _two_copies(tmp_path, {
        "base": str(kit.base), "merge": {"300": {"mode": "tv", "experts": [str(p) for p in kit.experts], "lam": 0.5}},
        "materialize": {"min_tensors": 1}}, b_bucket, b_credentials, merge=True)


def _archive(root) -> str:
    return f"{root}/{RUN}/checkpoint_artifacts/{ITER}"


def _warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if "cannot serve" in line]


def _served_by_a(flow: Flow, tmp_path, b_uri: str, why: str) -> dict:
    """The materialize report: built from A, B skipped naming why, once in the log."""
    report = json.loads(flow.report("materialize").read_text())
    validate(report, "report_materialize", what="materialize report")
    a_uri = _archive(f"file://{tmp_path / 'A'}")
    assert report["status"] == "built" and report["source"] == {**report["source"], "kind": "artifact-uri",
                                                                 "location": a_uri, "uri": a_uri}, report["source"]
    [skipped] = report["skipped_destinations"]
    assert skipped["source_uri"] == b_uri and why in skipped["detail"], skipped
    [warning] = _warnings(flow.log_of("materialize"))
    assert b_uri.removeprefix("file://").split("/" + RUN)[0] in warning and why in warning, warning
    assert json.loads((flow.teacher() / ".materialized").read_text())["source"]["uri"] == a_uri
    assert json.loads((flow.staged() / ".staged.json").read_text())["source_uri"] == a_uri
    assert sorted(walk_files(flow.staged())) == [".posttrain-checkpoint-artifact.json", ".staged.json", "model.pt"]
    return report


@pytest.mark.parametrize("fault", ["unmounted", "damaged"])
def test_materialize_teacher_of_a_pruned_artifact_is_served_by_the_other_copy_when_the_current_one_cannot(
        tmp_path, kit, fault):
    flow = _teacher_flow(tmp_path, kit)
    b_root = tmp_path / "B"
    if fault == "unmounted":
        b_root.rename(tmp_path / "B.unmounted")
        why = "no committed artifact"  # its manifest, read for the teacher's identity before any download
    else:  # one bit of B's model.pt flipped, its size and recorded digests kept
        obj = next(p for p in b_root.rglob("model.pt") if p.is_file())
        data = bytearray(obj.read_bytes())
        data[len(data) // 2] ^= 0x01
        obj.write_bytes(bytes(data))
        why = "model.pt"
    assert flow.planned("materialize_teacher", iter=300) == ["materialize", "materialize_teacher"]
    flow.ok("materialize_teacher", iter=300)
    report = _served_by_a(flow, tmp_path, _archive(f"file://{b_root}"), why)
    assert report["fetch"]["downloaded"] == ["model.pt"]
    assert flow.planned("materialize_teacher", iter=300) == []
    if fault != "unmounted":
        return
    # B back: the teacher built from A is B's model too (the identity does not name the copy): skipped, not rebuilt.
    (tmp_path / "B.unmounted").rename(b_root)
    teacher = file_bytes(flow.teacher())
    flow.ok("materialize_teacher", "--forcerun", "materialize", iter=300)
    again = json.loads(flow.report("materialize").read_text())
    assert again["status"] == "skipped" and again["source"]["location"] == _archive(f"file://{b_root}"), again
    assert again["fetch"] is None and "skipped_destinations" not in again
    assert file_bytes(flow.teacher()) == teacher and _warnings(flow.log_of("materialize")) == []


@pytest.mark.seaweedfs
@pytest.mark.parametrize("missing", ["file-gone", "none-at-all"])
def test_materialize_teacher_of_a_pruned_artifact_is_served_by_a_file_copy_when_the_s3_copys_credentials_are_missing(
        tmp_path, kit, seaweedfs_bucket, seaweedfs_credentials_path, missing):
    """B on SeaweedFS, A a ``file://`` root: without B's credentials (the configured file gone, or none at all)
    the teacher is built from A, which needs none; planning does not refuse what A can serve."""
    flow = _teacher_flow(tmp_path, kit, f"s3://{seaweedfs_bucket}", seaweedfs_credentials_path)
    flow.env.update(NO_CREDENTIALS, AWS_CONFIG_FILE=str(tmp_path / "none"), AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"))
    gone = tmp_path / "credentials-that-were-removed.json"
    if missing == "file-gone":
        flow.config["credentials"] = str(gone)
    flow.ok("materialize_teacher", iter=300)
    why = str(gone) if missing == "file-gone" else "pass the credentials of the endpoint the record was written against"
    _served_by_a(flow, tmp_path, _archive(f"s3://{seaweedfs_bucket}"), why)


def test_the_workflows_fetch_completes_a_stage_left_half_fetched_from_one_copy_from_the_other(tmp_path):
    """The fetch target of a pruned artifact killed after a file, from B (the receipt's current copy); B then
    unmounted: the rerun is served by A, keeps the files verified from B and downloads only the rest."""
    flow = _two_copies(tmp_path, {}, merge=False)
    target = str(flow.report("fetch"))
    flow.fails(target, kill_at="fetch:after-file:optim/__1_0.distcp")
    claim = json.loads((flow.staged() / ".staged.json").read_text())
    b_uri, a_uri = _archive(f"file://{tmp_path / 'B'}"), _archive(f"file://{tmp_path / 'A'}")
    assert claim["complete"] is False and claim["source_uri"] == b_uri
    verified = sorted(p for p in walk_files(flow.staged()) if not p.startswith(".") and not p.endswith(".part"))
    assert "optim/__1_0.distcp" in verified
    (tmp_path / "B").rename(tmp_path / "B.unmounted")

    flow.ok(target)
    report = json.loads(flow.report("fetch").read_text())
    validate(report, "report_fetch", what="fetch report")
    assert report["status"] == "resumed" and report["source_uri"] == a_uri and report["removed"] == [], report
    assert report["reused"] == verified and not set(report["downloaded"]) & set(verified)
    [skipped] = report["skipped_destinations"]
    assert skipped["source_uri"] == b_uri and ".posttrain-archive.json" in skipped["detail"]
    [warning] = _warnings(flow.log_of("fetch"))
    assert str(tmp_path / "B") in warning
    record = json.loads((flow.staged() / ".staged.json").read_text())
    assert record["complete"] is True and record["source_uri"] == a_uri
    original = file_bytes(tmp_path / "A" / RUN / "checkpoint_artifacts" / ITER)
    staged = file_bytes(flow.staged())
    assert all(staged[p] == original[p] for p in verified + report["downloaded"])
