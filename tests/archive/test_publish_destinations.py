"""A receipt may be the only record of where an archive lives: `ckptflow publish` to another
destination is refused by name unless it says it adds a destination, and then the receipt keeps both."""

from __future__ import annotations

import json
import uuid

import pytest

from ckptflow.jsonio import validate
from ckptflow.records import receipt as receipt_record
from helpers import servers
from helpers.artifacts import UPLOAD_PREFIX
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
