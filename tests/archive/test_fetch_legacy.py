"""fetch of legacy archives (no declaration): readable only where every file has a digest and no DCP."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from ckptflow.archive.fetch import fetch_artifact
from ckptflow.archive.publish import publish_artifact
from ckptflow.errors import Refused, VerificationFailed
from ckptflow.records import manifest as manifest_record
from ckptflow.records import staging as staging_record
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX
from helpers.trees import tree_bytes

MODEL = random.Random(5).randbytes(200_000)
TRAINER = random.Random(6).randbytes(3_000)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def put(store, rel: str, body: bytes, metadata: dict | None = None) -> None:
    store._client.put_object(Bucket=store.bucket, Key=f"{ARTIFACT_PREFIX}/{rel}", Body=body, Metadata=metadata or {})


def put_legacy_archive(store, *, digest_in_manifest: bool, digest_in_metadata: bool) -> bytes:
    """What an older trainer archived: payloads and a native manifest, no .posttrain-archive.json."""
    components = {}
    for name, rel, data in (("model", "model.pt", MODEL), ("trainer", "trainer.pt", TRAINER)):
        components[name] = {"format": "file", "path": rel, "size": len(data)}
        if digest_in_manifest:
            components[name]["sha256"] = sha(data)
        put(store, rel, data, {"sha256": sha(data)} if digest_in_metadata else None)
    manifest = json.dumps({"schema": manifest_record.SCHEMA, "iteration": 300, "components": components}).encode()
    put(store, manifest_record.FILENAME, manifest)
    return manifest


@pytest.mark.parametrize("in_manifest, in_metadata", [(False, True), (True, False), (True, True)])
def test_legacy_file_artifact_with_digests_is_fetched(sw_store, tmp_path, in_manifest, in_metadata):
    manifest = put_legacy_archive(sw_store, digest_in_manifest=in_manifest, digest_in_metadata=in_metadata)
    result = fetch_artifact(f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", tmp_path / "stage", store=sw_store, progress=False)
    assert result.status == "fetched" and result.to_report()["legacy"] is True
    assert (result.path / "model.pt").read_bytes() == MODEL
    assert (result.path / "trainer.pt").read_bytes() == TRAINER
    assert (result.path / manifest_record.FILENAME).read_bytes() == manifest  # archived bytes, unchanged
    record = staging_record.read_staging(result.path)
    assert record.complete and record.declaration_sha256 is None
    assert {e.path: e.sha256 for e in record.files}["model.pt"] == sha(MODEL)


def test_legacy_file_artifact_is_verified_against_its_metadata_digest(sw_store, tmp_path):
    put_legacy_archive(sw_store, digest_in_manifest=False, digest_in_metadata=True)
    put(sw_store, "model.pt", MODEL[:-1] + b"\x00", {"sha256": sha(MODEL)})  # same size, one byte off
    with pytest.raises(VerificationFailed, match=r"model\.pt downloaded as"):
        fetch_artifact(f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", tmp_path / "stage", store=sw_store, progress=False)
    assert not staging_record.read_staging(tmp_path / "stage" / "iter_000300").complete


def test_legacy_digests_that_contradict_each_other_are_refused(sw_store, tmp_path):
    put_legacy_archive(sw_store, digest_in_manifest=True, digest_in_metadata=False)
    put(sw_store, "model.pt", MODEL, {"sha256": "c" * 64})
    with pytest.raises(VerificationFailed, match=r"model\.pt: the manifest's sha256 .* contradicts"):
        fetch_artifact(f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", tmp_path / "stage", store=sw_store, progress=False)
    assert not (tmp_path / "stage").exists()


def test_legacy_artifact_without_any_digest_is_refused_as_unverifiable(sw_store, tmp_path):
    put_legacy_archive(sw_store, digest_in_manifest=False, digest_in_metadata=False)
    with pytest.raises(Refused, match=r"model\.pt has no digest .* cannot be verified") as err:
        fetch_artifact(f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", tmp_path / "stage", store=sw_store, progress=False)
    assert "ckptflow publish" in str(err.value)
    assert not (tmp_path / "stage").exists()


def test_legacy_dcp_artifact_without_declaration_is_refused(artifact, sw_store, tmp_path):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    sw_store.delete(f"{ARTIFACT_PREFIX}/.posttrain-archive.json")  # as archived by the earlier trainer
    (tmp_path / "stage").mkdir()
    before = tree_bytes(tmp_path / "stage")
    with pytest.raises(Refused, match=r"component 'optim' is a DCP directory: a listing cannot prove"):
        fetch_artifact(f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", tmp_path / "stage", store=sw_store, progress=False)
    assert tree_bytes(tmp_path / "stage") == before
