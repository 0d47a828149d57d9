"""Real `ckptflow publish` processes: killed with SIGKILL at each stage, raced, and refused fail-closed."""

from __future__ import annotations

import json
import signal

import pytest
from archive_helpers import remote_snapshot

from ckptflow.fsutil import walk_files
from ckptflow.jsonio import validate
from ckptflow.records import declaration as declaration_record
from ckptflow.records import receipt as receipt_record
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact
from helpers.cli import run_cli, start_cli, wait_for_file


def publish_args(artifact, bucket, creds, *extra):
    return ("publish", "--artifact-dir", str(artifact), "--upload-prefix", UPLOAD_PREFIX, "--bucket", bucket,
            "--credentials", str(creds), *extra)


def local_bytes(artifact):
    """The artifact's files but what publishing adds (its receipt, the part digests record beside the manifest)."""
    return {p: (artifact / p).read_bytes() for p in walk_files(artifact)
            if p not in (".uploaded", ".posttrain-part-digests.json")}


def assert_remote_matches_declaration(store):
    decl = declaration_record.parse_declaration(store.get_bytes(f"{ARTIFACT_PREFIX}/.posttrain-archive.json"))
    snap = remote_snapshot(store)
    for entry in decl.files:
        assert snap[f"{ARTIFACT_PREFIX}/{entry.path}"] == (entry.size, entry.sha256)
    assert len(snap) == len(decl.files) + 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "point", ["publish:after-declaration", "publish:after-payload", "publish:before-manifest", "publish:before-receipt"]
)
def test_publish_killed_at_any_stage_completes_on_rerun(point, artifact, sw_store, seaweedfs_credentials_path):
    before = local_bytes(artifact)
    args = publish_args(artifact, sw_store.bucket, seaweedfs_credentials_path)
    killed = run_cli(*args, env={"CKPTFLOW_TEST_KILL_AT": point})
    assert killed.returncode == -signal.SIGKILL
    assert not receipt_record.path_in(artifact).exists()
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    expected = {"adopted"} if point == "publish:before-receipt" else {"published"}
    assert rerun.report["status"] in expected
    assert_remote_matches_declaration(sw_store)
    assert local_bytes(artifact) == before  # nothing local lost or changed
    assert receipt_record.read_receipt(artifact).destination.prefix == ARTIFACT_PREFIX


@pytest.mark.slow
def test_two_publishers_of_the_same_artifact_both_succeed(artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    flag = tmp_path / "paused"
    args = publish_args(artifact, sw_store.bucket, seaweedfs_credentials_path)
    first = start_cli(*args, env={"CKPTFLOW_TEST_PAUSE_AT": "publish:after-declaration", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    wait_for_file(flag, first)
    second = run_cli(*args)  # runs to completion while the first holds after its declaration
    flag.unlink()
    out, err = first.communicate(timeout=120)
    assert second.returncode == 0, second.stderr
    assert first.returncode == 0, err
    assert {json.loads(out)["status"], second.report["status"]} <= {"published", "adopted"}
    assert_remote_matches_declaration(sw_store)


@pytest.mark.slow
def test_different_artifacts_racing_for_one_destination_one_wins(artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    other = make_artifact(tmp_path / "other-run", seed=3)
    flag = tmp_path / "paused"
    first = start_cli(*publish_args(artifact, sw_store.bucket, seaweedfs_credentials_path),
                      env={"CKPTFLOW_TEST_PAUSE_AT": "publish:after-declaration", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    wait_for_file(flag, first)
    loser = run_cli(*publish_args(other, sw_store.bucket, seaweedfs_credentials_path))
    flag.unlink()
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err and json.loads(out)["status"] == "published"
    assert loser.returncode == 1 and loser.report["status"] == "refused"
    assert "another destination" in loser.stderr and ".posttrain-archive.json" in loser.stderr
    assert not receipt_record.path_in(other).exists()
    assert_remote_matches_declaration(sw_store)


def test_delete_local_on_a_non_enforcing_endpoint_fails_closed(artifact, s3rver_bucket, s3rver_credentials_path, tmp_path):
    before = local_bytes(artifact)
    proc = run_cli(*publish_args(artifact, s3rver_bucket, s3rver_credentials_path, "--delete-local"),
                   env={"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 1 and proc.report["status"] == "refused"
    assert "127.0.0.1:18334" in proc.stderr and "probe" in proc.stderr
    assert local_bytes(artifact) == before
    assert not receipt_record.path_in(artifact).exists()


@pytest.mark.slow
def test_cli_publish_verify_report_shapes(artifact, sw_store, seaweedfs_credentials_path):
    pub = run_cli(*publish_args(artifact, sw_store.bucket, seaweedfs_credentials_path))
    assert pub.returncode == 0, pub.stderr
    assert pub.report["status"] == "published" and pub.report["destination"]["prefix"] == ARTIFACT_PREFIX
    validate(pub.report, "report_publish", what="publish report")
    ver = run_cli("verify", "--artifact-dir", str(artifact), "--credentials", str(seaweedfs_credentials_path))
    assert ver.returncode == 0 and ver.report["status"] == "verified"
    validate(ver.report, "report_verify", what="verify report")
    (artifact / "optim.pt").unlink()
    pr = run_cli("prune-verified", "--paths", str(artifact), "--credentials", str(seaweedfs_credentials_path), "--dry-run")
    assert pr.returncode == 0 and pr.report["status"] == "dry-run"
    validate(pr.report, "report_prune_verified", what="prune report")
    assert "ckptflow-test-secret" not in pub.stdout + pub.stderr + ver.stdout + ver.stderr
