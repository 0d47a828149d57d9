"""A prefix without a declaration may already hold objects another tool wrote (a checkpoint uploaded by hand
before ckptflow was adopted): before its first write there, publish judges each one. An object with the
declared file's size and SHA-256 (its metadata, or its bytes read) is adopted and reported so; any other
object makes publish refuse by key, before anything is written, and its dry run says the same. Real
SeaweedFS, moto and ``file://`` archives."""

from __future__ import annotations

import hashlib

import pytest
from archive_helpers import remote_snapshot

from ckptflow.archive.publish import publish_artifact
from ckptflow.archive.publish_plan import plan_publication
from ckptflow.digest import FileDigest
from ckptflow.errors import Refused
from ckptflow.jsonio import validate
from ckptflow.records import receipt as receipt_record
from ckptflow.store.local import LocalStore
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX
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


def test_an_identical_object_uploaded_by_hand_is_adopted_and_reported(artifact, any_store):
    data = (artifact / "model.pt").read_bytes()
    _put_by_hand(any_store, MODEL_KEY, data)
    plan = plan_publication(artifact, any_store, UPLOAD_PREFIX)
    validate(plan, "report_publish", what="publish dry-run report")
    assert plan["adopted_objects"] == [{"path": "model.pt", "proof": "read"}]
    result = publish_artifact(artifact, any_store, UPLOAD_PREFIX, progress=False)
    assert result.status == "published"
    report = result.to_report()
    validate(report, "report_publish", what="publish report")
    assert report["adopted_objects"] == [{"path": "model.pt", "proof": "read"}]
    # Its bytes were read and are the declared ones: it now carries their sha256 metadata as well.
    info = any_store.head(MODEL_KEY)
    assert info.sha256 == hashlib.sha256(data).hexdigest() and any_store.get_bytes(MODEL_KEY, max_bytes=1 << 30) == data


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
