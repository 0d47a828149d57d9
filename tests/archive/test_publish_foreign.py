"""A prefix without a declaration may already hold objects another tool wrote (a checkpoint uploaded by hand
before ckptflow was adopted): before its first write there, publish judges each one. An object with the
declared file's size and SHA-256 (its metadata, or its bytes read) is adopted and reported so; any other
object makes publish refuse by key, before anything is written, and its dry run says the same. Real
SeaweedFS, moto and ``file://`` archives."""

from __future__ import annotations

import hashlib
import os

import pytest
from archive_helpers import remote_snapshot
from test_publish_processes import publish_args

from ckptflow.archive.publish import publish_artifact
from ckptflow.archive.publish_plan import plan_publication
from ckptflow.archive.verify import check_receipt
from ckptflow.digest import FileDigest
from ckptflow.errors import Refused
from ckptflow.jsonio import validate
from ckptflow.records import receipt as receipt_record
from ckptflow.store.local import LocalStore
from helpers import servers
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX
from helpers.cli import run_cli
from helpers.trees import tree_state

MODEL_KEY = f"{ARTIFACT_PREFIX}/model.pt"


def _put_by_hand(store, key: str, data: bytes) -> None:
    """Another tool's upload: the bytes at ``key``, without ckptflow's sha256 metadata."""
    if isinstance(store, LocalStore):
        path = store.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    else:
        store._client.put_object(Bucket=store.bucket, Key=key, Body=data)


def _remote(store) -> dict:
    return {o.key: (o.size, store.get_bytes(o.key, max_bytes=1 << 30)) for o in store.list(ARTIFACT_PREFIX + "/")}


def test_publish_refuses_a_foreign_object_under_an_undeclared_prefix(artifact, any_store):
    foreign = b"another tool's checkpoint" * 1000
    _put_by_hand(any_store, MODEL_KEY, foreign)
    before = _remote(any_store), tree_state(artifact)
    for attempt in (lambda: plan_publication(artifact, any_store, UPLOAD_PREFIX),
                    lambda: publish_artifact(artifact, any_store, UPLOAD_PREFIX, progress=False)):
        with pytest.raises(Refused) as refused:
            attempt()
        message = str(refused.value)
        assert str(any_store.destination.uri(MODEL_KEY)) in message and "no declaration" in message, message
        assert "another destination" in refused.value.remedy
        # Nothing written: the foreign object keeps its bytes, no declaration claims the prefix.
        assert (_remote(any_store), tree_state(artifact)) == before
    assert not receipt_record.path_in(artifact).exists()


def test_an_object_that_is_not_a_file_of_the_artifact_is_refused_by_key(artifact, any_store):
    key = f"{ARTIFACT_PREFIX}/notes/README.txt"
    _put_by_hand(any_store, key, b"uploaded by hand")
    before = _remote(any_store)
    with pytest.raises(Refused) as refused:
        publish_artifact(artifact, any_store, UPLOAD_PREFIX, progress=False)
    assert str(any_store.destination.uri(key)) in str(refused.value) and "not a file of" in str(refused.value)
    assert _remote(any_store) == before


def test_an_identical_object_uploaded_by_hand_is_adopted_and_reported(request, artifact, any_store):
    data = (artifact / "model.pt").read_bytes()
    _put_by_hand(any_store, MODEL_KEY, data)
    plan = plan_publication(artifact, any_store, UPLOAD_PREFIX)
    validate(plan, "report_publish", what="publish dry-run report")
    assert plan["adopted_objects"] == [{"path": "model.pt", "proof": "read"}]
    assert {f["path"]: f["action"] for f in plan["files"]}["model.pt"] == "adopt"
    result = publish_artifact(artifact, any_store, UPLOAD_PREFIX, progress=False)
    assert result.status == "published"
    report = result.to_report()
    validate(report, "report_publish", what="publish report")
    assert report["adopted_objects"] == [{"path": "model.pt", "proof": "read"}]
    # Not sent again: the dry run's bytes to send are the bytes the run sent.
    assert "model.pt" not in report["uploaded"] and report["uploaded_bytes"] == plan["bytes_to_send"] - sum(
        f["size"] for f in plan["files"] if f["action"] == "send" and f["path"] not in report["uploaded"])
    # Its bytes were read and are the declared ones: it now carries their sha256 metadata as well.
    info = any_store.head(MODEL_KEY)
    assert info.sha256 == hashlib.sha256(data).hexdigest() and any_store.get_bytes(MODEL_KEY, max_bytes=1 << 30) == data
    if request.node.callspec.params["any_store"] == "moto":
        # An endpoint that computes the copy's SHA-256 checksum (as AWS does): the receipt records it, so the
        # adopted object is proven by HEAD.
        receipt = receipt_record.read_receipt(artifact)
        states = {s.path: s.state for s in check_receipt(any_store, receipt)}
        assert "model.pt" in receipt.server_checksums and states["model.pt"] == "ok", states


def test_an_identical_object_with_its_sha256_metadata_is_adopted_without_sending_it(artifact, any_store):
    data = (artifact / "model.pt").read_bytes()
    any_store.put_file(MODEL_KEY, artifact / "model.pt", digest=FileDigest(len(data), hashlib.sha256(data).hexdigest()))
    plan = plan_publication(artifact, any_store, UPLOAD_PREFIX)
    assert plan["adopted_objects"] == [{"path": "model.pt", "proof": "sha256 metadata"}]
    assert {f["path"]: f["action"] for f in plan["files"]}["model.pt"] == "adopt"
    result = publish_artifact(artifact, any_store, UPLOAD_PREFIX, progress=False)
    assert result.status == "published" and "model.pt" not in result.uploaded
    assert result.to_report()["adopted_objects"] == [{"path": "model.pt", "proof": "sha256 metadata"}]


def test_a_same_size_object_with_other_bytes_is_refused_though_its_size_matches(artifact, sw_store):
    data = bytearray((artifact / "model.pt").read_bytes())
    data[1000] ^= 0xFF
    _put_by_hand(sw_store, MODEL_KEY, bytes(data))
    before = remote_snapshot(sw_store)
    with pytest.raises(Refused) as refused:
        publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert "sha256" in str(refused.value) and MODEL_KEY in str(refused.value)
    assert remote_snapshot(sw_store) == before


@pytest.mark.parametrize("backend", ["seaweedfs", "file"])
def test_an_identical_object_is_adopted_in_place_by_the_dry_run_and_the_run_never_sent_or_rewritten(
        request, tmp_path, artifact, backend):
    """``ckptflow publish`` (real processes): an object another tool left with the declared bytes and no
    metadata is planned ``adopt`` by the dry run and adopted by the run, which neither sends it nor writes its
    bytes (on ``file://`` the very file stays, inode and mtime; on S3 the server copies it onto itself to add
    the sha256 metadata); ``verify --read-data`` then proves the archive (SeaweedFS computes no server
    checksum for a copy, so that object's proof is its bytes)."""
    data = (artifact / "model.pt").read_bytes()
    if backend == "file":
        root = tmp_path / "archive"
        root.mkdir()
        bucket, creds = f"file://{root}", tmp_path / "no-credentials.json"
        obj = root / MODEL_KEY
        obj.parent.mkdir(parents=True)
        obj.write_bytes(data)
        before = os.stat(obj)
    else:
        bucket = request.getfixturevalue("seaweedfs_bucket")
        creds = request.getfixturevalue("seaweedfs_credentials_path")
        servers.s3_client(creds).put_object(Bucket=bucket, Key=MODEL_KEY, Body=data)
    args = publish_args(artifact, bucket, creds)
    if backend == "file":
        args = args[:-2]  # no credentials for a file:// archive
    dry = run_cli(*args, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    planned = {f["path"]: f["action"] for f in dry.report["files"]}
    assert planned["model.pt"] == "adopt" and dry.report["adopted_objects"] == [{"path": "model.pt", "proof": "read"}]
    real = run_cli(*args)
    assert real.returncode == 0, real.stderr
    assert real.report["adopted_objects"] == [{"path": "model.pt", "proof": "read"}]
    assert sorted(real.report["uploaded"]) == sorted(p for p, a in planned.items()
                                                     if a == "send" and p != ".posttrain-checkpoint-artifact.json"
                                                     and p != ".posttrain-archive.json")
    assert real.report["sent_bytes"] == sum(f["size"] for f in dry.report["files"] if f["path"] in real.report["uploaded"])
    if backend == "file":
        after = os.stat(obj)
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns) and obj.read_bytes() == data
    else:
        head = servers.s3_client(creds).head_object(Bucket=bucket, Key=MODEL_KEY)
        assert head["Metadata"]["sha256"] == hashlib.sha256(data).hexdigest() and head["ContentLength"] == len(data)
    verify = run_cli("verify", "--artifact-dir", str(artifact), "--read-data", *(() if backend == "file" else ("--credentials", str(creds))))
    assert verify.returncode == 0, verify.stderr
