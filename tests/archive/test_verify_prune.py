"""verify (HEAD against the receipt) and prune-verified (delete only what is proven elsewhere)."""

from __future__ import annotations

import hashlib

import pytest

from ckptflow.archive.probe import run_probe
from ckptflow.archive.prune import prune_verified
from ckptflow.archive.publish import publish_artifact
from ckptflow.archive.verify import verify_artifact
from ckptflow.errors import NotFound, Refused
from ckptflow.fsutil import walk_files
from ckptflow.records import receipt as receipt_record
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact
from helpers.cli import run_cli

PAYLOAD = ["model.pt", "optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp", "optim/__2_0.distcp"]


@pytest.fixture
def published(artifact, sw_store):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    return artifact


def store_for(store):
    return lambda destination: store


def test_verify_passes_on_an_intact_archive(published, sw_store):
    result = verify_artifact(published, store_for(sw_store))
    assert result.ok
    assert {o.path for o in result.objects} >= {".posttrain-archive.json", "model.pt", "optim/__2_0.distcp"}


def test_verify_content_check_downloads_and_hashes(published, sw_store):
    assert verify_artifact(published, store_for(sw_store), read_data=True).ok


def test_verify_names_a_changed_remote_object(published, sw_store):
    key = f"{ARTIFACT_PREFIX}/optim/__0_0.distcp"
    sw_store._client.put_object(Bucket=sw_store.bucket, Key=key, Body=b"tampered", Metadata={"sha256": "0" * 64})
    result = verify_artifact(published, store_for(sw_store))
    bad = [o for o in result.objects if o.state != "ok"]
    assert [(o.path, o.state) for o in bad] == [("optim/__0_0.distcp", "changed")]


def test_verify_reports_missing_and_unverifiable_objects(published, sw_store):
    sw_store.delete(f"{ARTIFACT_PREFIX}/model.pt")
    meta_key = f"{ARTIFACT_PREFIX}/optim/.metadata"
    sw_store._client.put_object(Bucket=sw_store.bucket, Key=meta_key, Body=(published / "optim/.metadata").read_bytes())
    states = {o.path: o.state for o in verify_artifact(published, store_for(sw_store)).objects}
    assert states["model.pt"] == "missing" and states["optim/.metadata"] == "unverifiable"


def test_verify_refuses_a_receipt_bound_to_another_endpoint(published, sw_store):
    rec = receipt_record.read_receipt(published)
    moved = receipt_record.ReceiptDestination(rec.destination.scheme, "s3.elsewhere.example:443", rec.destination.bucket, rec.destination.prefix)
    receipt_record.write_receipt(published, receipt_record.Receipt(moved, rec.declaration_sha256, rec.files, rec.uploaded_at))
    with pytest.raises(Refused, match=r"s3\.elsewhere\.example"):
        verify_artifact(published, store_for(sw_store))


def test_verify_without_receipt_says_publish_first(artifact, sw_store):
    with pytest.raises(NotFound, match="ckptflow publish"):
        verify_artifact(artifact, store_for(sw_store))


# ------------------------------------------------------------------------------------------- prune


@pytest.fixture
def qualified(sw_store):
    assert run_probe(sw_store, "scratch").record.passed
    return sw_store


def test_prune_removes_payloads_and_keeps_manifest_and_receipt(published, qualified):
    sizes = sum((published / p).stat().st_size for p in PAYLOAD)
    (published / "optim.pt").unlink()  # the stale file is not covered by the receipt (see below)
    report = prune_verified([published / "model.pt"], store_for(qualified))
    assert report.kept == []
    assert report.removed[0]["files"] == PAYLOAD and report.freed_bytes == sizes
    assert list(walk_files(published)) == [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded"]


def test_prune_dry_run_deletes_nothing(published, qualified):
    (published / "optim.pt").unlink()
    before = {p: (published / p).read_bytes() for p in walk_files(published)}
    report = prune_verified([published], store_for(qualified), dry_run=True)
    assert report.removed and report.removed[0]["dry_run"]
    assert {p: (published / p).read_bytes() for p in walk_files(published)} == before


def test_extra_local_file_not_in_the_receipt_blocks_pruning(published, qualified):
    report = prune_verified([published], store_for(qualified))
    assert report.removed == [] and "optim.pt" in report.kept[0]["reason"]
    assert all((published / p).exists() for p in PAYLOAD)


def test_an_unpublished_artifact_is_kept_saying_to_publish_it_first(published, qualified):
    (published / "optim.pt").unlink()
    receipt_record.path_in(published).unlink()
    report = prune_verified([published], store_for(qualified))
    reason = report.kept[0]["reason"]
    assert report.removed == [] and reason.startswith("not published: no receipt .uploaded")
    assert f"ckptflow publish --artifact-dir {published}" in reason
    assert all((published / p).exists() for p in PAYLOAD)


def test_legacy_text_receipt_never_authorizes_pruning(published, qualified):
    (published / "optim.pt").unlink()
    receipt_record.path_in(published).write_text("uploaded 2024-01-01\n")
    report = prune_verified([published], store_for(qualified))
    assert "legacy" in report.kept[0]["reason"]
    assert all((published / p).exists() for p in PAYLOAD)


def test_changed_local_bytes_keep_the_copy(published, qualified):
    (published / "optim.pt").unlink()
    (published / "model.pt").write_bytes(b"retrained in place")
    report = prune_verified([published], store_for(qualified))
    assert "changed" in report.kept[0]["reason"] and (published / "model.pt").exists()


def test_remote_corruption_keeps_the_copy(published, qualified):
    (published / "optim.pt").unlink()
    key = f"{ARTIFACT_PREFIX}/model.pt"
    qualified._client.put_object(Bucket=qualified.bucket, Key=key, Body=b"corrupt", Metadata={"sha256": "1" * 64})
    report = prune_verified([published], store_for(qualified))
    assert "model.pt" in report.kept[0]["reason"] and (published / "model.pt").exists()


def test_remote_object_claiming_the_digest_with_another_size_is_an_error(published, qualified):
    (published / "optim.pt").unlink()
    key = f"{ARTIFACT_PREFIX}/model.pt"
    real = hashlib.sha256((published / "model.pt").read_bytes()).hexdigest()
    qualified._client.put_object(Bucket=qualified.bucket, Key=key, Body=b"short", Metadata={"sha256": real})
    report = prune_verified([published], store_for(qualified))
    assert report.has_errors and report.kept[0]["error"] is True
    assert (published / "model.pt").exists()


def test_prune_without_a_passing_probe_keeps_the_copy(published, sw_store, s3rver_credentials_path, s3rver_bucket):
    from ckptflow.store.credentials import load_credentials

    (published / "optim.pt").unlink()
    unqualified = S3Store(s3rver_bucket, load_credentials(s3rver_credentials_path))
    rec = receipt_record.read_receipt(published)
    moved = receipt_record.ReceiptDestination.at(unqualified.destination, rec.destination.prefix)
    receipt_record.write_receipt(published, receipt_record.Receipt(moved, rec.declaration_sha256, rec.files, rec.uploaded_at))
    report = prune_verified([published], store_for(unqualified))
    assert report.removed == [] and "probe" in report.kept[0]["reason"]
    assert all((published / p).exists() for p in PAYLOAD)


def test_prune_refuses_paths_outside_checkpoint_artifacts(tmp_path, qualified):
    d = tmp_path / "checkpoints" / "iter_000300"
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(b"x")
    report = prune_verified([d], store_for(qualified))
    assert "checkpoint_artifacts" in report.kept[0]["reason"] and (d / "model.pt").exists()


def test_a_local_payload_rewritten_after_publication_is_kept_as_an_error_naming_the_file(published, qualified):
    (published / "optim.pt").unlink()
    with open(published / "optim" / "__1_0.distcp", "r+b") as fh:
        fh.write(b"rewritten in place")
    report = prune_verified([published], store_for(qualified))
    assert report.removed == [] and report.has_errors
    [kept] = report.kept
    assert kept["error"] is True and "optim/__1_0.distcp" in kept["reason"]
    assert all((published / p).exists() for p in PAYLOAD)


@pytest.mark.slow
def test_prune_verified_exits_1_naming_a_payload_rewritten_after_publication(tmp_path):
    """By ``--paths`` and by ``--keep-free``: the copy is kept, and the command fails naming the file."""
    archive = tmp_path / "archive"
    archive.mkdir()
    assert run_probe(LocalStore(archive), "scratch").record.passed
    run = tmp_path / "runs" / "proj" / "group" / "run" / "20261129T000000Z"
    arts = [make_artifact(run, iteration=it, seed=it) for it in (100, 200)]
    for art in arts:
        (art / "optim.pt").unlink()
        assert run_cli("publish", "--artifact-dir", str(art), "--bucket", f"file://{archive}").returncode == 0
    with open(arts[0] / "model.pt", "r+b") as fh:
        fh.write(b"retrained in place")
    by_paths = run_cli("prune-verified", "--paths", str(arts[0]))
    to_target = run_cli("prune-verified", "--runs-root", str(tmp_path / "runs"), "--keep-free", "100%")
    for proc in (by_paths, to_target):
        assert proc.returncode == 1, proc.stdout + proc.stderr
        [kept] = [k for k in proc.report["kept"] if k["path"] == str(arts[0])]
        assert kept.get("error") is True and "model.pt" in kept["reason"]
        assert str(arts[0]) in proc.stderr
        assert proc.report["removed"] == []
    assert (arts[0] / "model.pt").read_bytes().startswith(b"retrained in place")
