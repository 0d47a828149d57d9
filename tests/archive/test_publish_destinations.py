"""A receipt may be the only record of where an archive lives: `ckptflow publish` to another
destination is refused by name unless it says it adds a destination, and then the receipt keeps both."""

from __future__ import annotations

import json
import uuid

import pytest

from ckptflow.archive.probe import run_probe
from ckptflow.jsonio import validate
from ckptflow.records import receipt as receipt_record
from ckptflow.store.credentials import load_credentials
from ckptflow.store.s3 import S3Store
from helpers import servers
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX
from helpers.cli import run_cli


@pytest.fixture
def second_bucket(seaweedfs_credentials_path):
    """Another fresh SeaweedFS bucket on the same endpoint; removed afterwards."""
    bucket = f"ckptflow-t-{uuid.uuid4().hex[:16]}"
    servers.create_bucket(seaweedfs_credentials_path, bucket)
    yield bucket
    servers.remove_bucket(seaweedfs_credentials_path, bucket)


def _publish(artifact, bucket, creds, *extra):
    return run_cli("publish", "--artifact-dir", str(artifact), "--upload-prefix", UPLOAD_PREFIX, "--bucket", bucket,
                   "--credentials", str(creds), *extra)


def _keys(creds, bucket) -> list[str]:
    page = servers.s3_client(creds).list_objects_v2(Bucket=bucket)
    return [o["Key"] for o in page.get("Contents", [])]


@pytest.mark.seaweedfs
@pytest.mark.slow
def test_publishing_elsewhere_is_refused_unless_it_adds_a_destination_and_then_both_are_recorded(
        artifact, seaweedfs_bucket, second_bucket, seaweedfs_credentials_path):
    creds = seaweedfs_credentials_path
    (artifact / "optim.pt").unlink()
    first = _publish(artifact, seaweedfs_bucket, creds)
    assert first.returncode == 0, first.stderr
    receipt = (artifact / ".uploaded").read_bytes()
    assert "earlier_destinations" not in json.loads(receipt)  # a one-destination receipt keeps its old shape

    refused = _publish(artifact, second_bucket, creds)
    assert refused.returncode != 0, refused.stdout
    assert ".uploaded" in refused.stderr and seaweedfs_bucket in refused.stderr and "--add-destination" in refused.stderr
    assert (artifact / ".uploaded").read_bytes() == receipt
    assert _keys(creds, second_bucket) == []  # refused before anything was written there

    added = _publish(artifact, second_bucket, creds, "--add-destination")
    assert added.returncode == 0, added.stderr
    validate(added.report, "report_publish", what="publish report")
    old = receipt_record.parse_receipt(receipt)  # a receipt written before the field still reads
    now = receipt_record.read_receipt(artifact)
    assert now.destination.bucket == second_bucket and now.earlier_destinations == (old.destination,)
    assert [d["bucket"] for d in added.report["earlier_destinations"]] == [seaweedfs_bucket]
    assert run_cli("verify", "--artifact-dir", str(artifact), "--credentials", str(creds)).returncode == 0

    # A later publication to the current destination keeps the earlier one; going back needs the flag too.
    again = _publish(artifact, second_bucket, creds)
    assert again.returncode == 0, again.stderr
    assert receipt_record.read_receipt(artifact).earlier_destinations == (old.destination,)
    before = (artifact / ".uploaded").read_bytes()
    back = _publish(artifact, seaweedfs_bucket, creds)
    assert back.returncode != 0 and second_bucket in back.stderr
    assert (artifact / ".uploaded").read_bytes() == before
    moved = _publish(artifact, seaweedfs_bucket, creds, "--add-destination")
    assert moved.returncode == 0, moved.stderr
    rec = receipt_record.read_receipt(artifact)
    assert rec.destination == old.destination and [d.bucket for d in rec.earlier_destinations] == [second_bucket]


def _verify(artifact, creds, *extra):
    proc = run_cli("verify", *extra, "--credentials", str(creds))
    assert proc.report is not None, proc.stderr
    validate(proc.report, "report_verify", what="verify report")
    return proc


def _states_by_bucket(report) -> dict[str, dict[str, str]]:
    """{bucket: {path: state}} of every destination a verify report (of one artifact) checked."""
    checks = [report, *report.get("other_destinations", ())]
    return {c["destination"]["bucket"]: {o["path"]: o["state"] for o in c.get("objects", ())} for c in checks}


@pytest.mark.seaweedfs
@pytest.mark.slow
def test_verify_scrub_and_prune_check_every_destination_the_receipt_lists(
        artifact, seaweedfs_bucket, second_bucket, seaweedfs_credentials_path):
    creds = seaweedfs_credentials_path
    (artifact / "optim.pt").unlink()
    assert _publish(artifact, seaweedfs_bucket, creds).returncode == 0
    assert _publish(artifact, second_bucket, creds, "--add-destination").returncode == 0
    for bucket in (seaweedfs_bucket, second_bucket):
        assert run_probe(S3Store(bucket, load_credentials(creds)), "scratch").record.passed
    both = _verify(artifact, creds, "--artifact-dir", str(artifact))
    assert both.returncode == 0, both.stderr
    assert {b: set(s.values()) for b, s in _states_by_bucket(both.report).items()} == {
        seaweedfs_bucket: {"ok"}, second_bucket: {"ok"}}

    servers.s3_client(creds).delete_object(Bucket=seaweedfs_bucket, Key=f"{ARTIFACT_PREFIX}/model.pt")  # the first copy
    lost = _verify(artifact, creds, "--artifact-dir", str(artifact))
    assert lost.returncode == 1 and seaweedfs_bucket in lost.stderr and "model.pt" in lost.stderr
    assert _states_by_bucket(lost.report)[seaweedfs_bucket]["model.pt"] == "missing"
    assert set(_states_by_bucket(lost.report)[second_bucket].values()) == {"ok"}
    assert _verify(artifact, creds, "--artifact-dir", str(artifact), "--destination",
                   f"s3://{second_bucket}").returncode == 0
    runs_root = str(artifact.parents[2])
    assert _verify(artifact, creds, "--all-under", runs_root).returncode == 1
    assert _verify(artifact, creds, "--all-under", runs_root, "--destination", f"s3://{second_bucket}").returncode == 0
    assert _verify(artifact, creds, "--all-under", runs_root, "--destination",
                   f"s3://{seaweedfs_bucket}").returncode == 1

    kept = run_cli("prune-verified", "--paths", str(artifact), "--credentials", str(creds))
    assert kept.returncode == 1 and kept.report["removed"] == [] and seaweedfs_bucket in kept.report["kept"][0]["reason"]
    assert (artifact / "model.pt").exists()
    pruned = run_cli("prune-verified", "--paths", str(artifact), "--destination", f"s3://{second_bucket}",
                     "--credentials", str(creds))
    assert pruned.returncode == 0 and not (artifact / "model.pt").exists(), pruned.stdout
