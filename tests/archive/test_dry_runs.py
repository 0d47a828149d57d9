"""A dry run writes nothing anywhere: not to the archive (objects, unfinished uploads), not to the probe
cache, not beside the artifact. Real CLI processes against a real SeaweedFS bucket."""

from __future__ import annotations

import pytest
from test_publish_processes import publish_args

from ckptflow.jsonio import validate
from helpers import servers
from helpers.artifacts import ARTIFACT_PREFIX, make_artifact
from helpers.cli import run_cli
from helpers.trees import tree_state


def _bucket_state(creds, bucket) -> tuple:
    client = servers.s3_client(creds)
    objects = sorted((o["Key"], o["Size"], o["ETag"], o["LastModified"])
                     for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
                     for o in page.get("Contents", []))
    uploads = sorted((u["Key"], u["UploadId"]) for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []))
    return objects, uploads


@pytest.fixture
def published(tmp_path, seaweedfs_bucket, seaweedfs_credentials_path, probe_cache):
    art = make_artifact(tmp_path / "run1")
    (art / "optim.pt").unlink()  # the stale unselected file: not covered by the receipt, it blocks pruning
    pub = run_cli(*publish_args(art, seaweedfs_bucket, seaweedfs_credentials_path))
    assert pub.returncode == 0, pub.stderr
    assert not (probe_cache / "probes").exists() or not any((probe_cache / "probes").iterdir())
    return art


def _everything(art, cache, creds, bucket) -> tuple:
    return tree_state(art.parent.parent), tree_state(cache), _bucket_state(creds, bucket)


@pytest.mark.seaweedfs
@pytest.mark.slow
def test_prune_verified_dry_run_does_not_probe_and_says_the_real_run_would(
        published, probe_cache, seaweedfs_bucket, seaweedfs_credentials_path):
    creds = seaweedfs_credentials_path
    before = _everything(published, probe_cache, creds, seaweedfs_bucket)
    dry = run_cli("prune-verified", "--paths", str(published), "--credentials", str(creds), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    validate(dry.report, "report_prune_verified", what="prune-verified report")
    assert dry.report["status"] == "dry-run" and dry.report["kept"] == []
    [entry] = dry.report["removed"]
    assert entry["dry_run"] and "model.pt" in entry["files"]
    assert "would probe endpoint" in entry["needs"] and seaweedfs_bucket in entry["needs"]
    assert _everything(published, probe_cache, creds, seaweedfs_bucket) == before
    # The real run probes (a record is cached), then prunes; a dry run after it needs nothing more.
    real = run_cli("prune-verified", "--paths", str(published), "--credentials", str(creds))
    assert real.returncode == 0 and real.report["removed"][0]["files"] == entry["files"], real.stderr
    again = run_cli("prune-verified", "--paths", str(published), "--credentials", str(creds), "--dry-run")
    assert again.returncode == 0 and all("needs" not in r for r in again.report["removed"]), again.stderr


@pytest.mark.seaweedfs
@pytest.mark.slow
def test_publish_dry_run_names_every_destination_and_writes_nothing(
        tmp_path, probe_cache, seaweedfs_bucket, seaweedfs_credentials_path):
    creds = seaweedfs_credentials_path
    art = make_artifact(tmp_path / "run1")
    probe_cache.mkdir(parents=True, exist_ok=True)
    before = _everything(art, probe_cache, creds, seaweedfs_bucket)
    dry = run_cli(*publish_args(art, seaweedfs_bucket, creds, "--delete-local", "--dry-run"))
    assert dry.returncode == 0, dry.stderr
    validate(dry.report, "report_publish", what="publish report")
    assert dry.report["status"] == "dry-run" and dry.report["would"] == "published"
    files = {f["path"]: f for f in dry.report["files"]}
    assert set(files) == {e["path"] for e in dry.report["inventory"]} | {".posttrain-archive.json"}
    for path, f in files.items():
        assert f["uri"] == f"s3://{seaweedfs_bucket}/{ARTIFACT_PREFIX}/{path}" and f["action"] == "send"
    assert dry.report["bytes_to_send"] == sum(f["size"] for f in files.values())
    assert files["model.pt"]["size"] == (art / "model.pt").stat().st_size
    assert "model.pt" in dry.report["would_remove"]
    assert _everything(art, probe_cache, creds, seaweedfs_bucket) == before
    # Published, then its receipt lost: the dry run says the archive there would be adopted, and a dry
    # run over a matching receipt that it would be skipped; neither writes anything.
    real = run_cli(*publish_args(art, seaweedfs_bucket, creds))
    assert real.returncode == 0, real.stderr
    (art / ".uploaded").unlink()
    for would, action in (("adopted", "adopt"), ("skipped", "skip")):
        if would == "skipped":
            assert run_cli(*publish_args(art, seaweedfs_bucket, creds)).returncode == 0
        state = _everything(art, probe_cache, creds, seaweedfs_bucket)
        again = run_cli(*publish_args(art, seaweedfs_bucket, creds, "--dry-run"))
        assert again.returncode == 0 and again.report["would"] == would, again.stderr
        assert {f["action"] for f in again.report["files"]} == {action} and again.report["bytes_to_send"] == 0
        assert _everything(art, probe_cache, creds, seaweedfs_bucket) == state
