"""verify, prune-verified and publish --delete-local never delete a local copy they did not prove elsewhere.

Regressions: a remote object replaced by other bytes of the same size under the original ``sha256``
metadata (single part, multipart, and in place on ``file://``); a payload re-saved between the check and
the unlink; a prune that stops mid-list or races another prune; a receipt copied from another
artifact; a ``file://`` archive that overlaps the artifact itself.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil

import pytest

from ckptflow.archive.probe import run_probe
from ckptflow.archive.prune import prune_verified
from ckptflow.archive.publish import publish_artifact
from ckptflow.archive.verify import verify_artifact
from ckptflow.errors import InvalidRecord, Refused
from ckptflow.jsonio import validate
from ckptflow.records import receipt as receipt_record
from ckptflow.store.credentials import load_credentials
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact
from helpers.cli import start_cli, wait_for_file
from helpers.trees import tree_bytes

PAYLOAD = ["model.pt", "optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp", "optim/__2_0.distcp"]


def store_for(store):
    return lambda destination: store


def forge(store: S3Store, key: str, size: int, sha256: str) -> None:
    """Replace ``key`` with other bytes of the same size under the original ``sha256`` metadata (plain PUT)."""
    body = random.Random(7).randbytes(size)
    store._client.put_object(Bucket=store.bucket, Key=key, Body=body, Metadata={"sha256": sha256})
    assert store.head(key).sha256 == sha256 and store.head(key).size == size


def entry(artifact, path):
    return next(e for e in receipt_record.read_receipt(artifact).files if e.path == path)


@pytest.fixture
def qualified(sw_store):
    assert run_probe(sw_store, "scratch").record.passed
    return sw_store


@pytest.fixture
def published(artifact, qualified):
    publish_artifact(artifact, qualified, UPLOAD_PREFIX, progress=False)
    (artifact / "optim.pt").unlink()  # not archived: it would (rightly) block pruning
    return artifact


# ------------------------------------------------------------------ replaced remote objects (defect 5)


def test_same_size_overwrite_with_forged_metadata_fails_verify_and_keeps_the_copy(published, qualified):
    model = entry(published, "model.pt")
    forge(qualified, f"{ARTIFACT_PREFIX}/model.pt", model.size, model.sha256)
    states = {o.path: o for o in verify_artifact(published, store_for(qualified)).objects}
    assert states["model.pt"].state == "changed" and "checksum" in states["model.pt"].detail
    report = prune_verified([published], store_for(qualified))
    assert report.removed == [] and "model.pt" in report.kept[0]["reason"]
    assert (published / "model.pt").stat().st_size == model.size


def test_multipart_overwrite_with_forged_metadata_fails_verify_and_keeps_the_copy(
    tmp_path, seaweedfs_bucket, seaweedfs_credentials_path
):
    store = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path),
                    multipart_threshold=1 << 20, part_size=5 << 20)
    assert run_probe(store, "scratch").record.passed
    art = make_artifact(tmp_path / "mp", model_bytes=(6 << 20) + 123)
    (art / "optim.pt").unlink()
    publish_artifact(art, store, UPLOAD_PREFIX, progress=False)
    key = f"{ARTIFACT_PREFIX}/model.pt"
    head = store._client.head_object(Bucket=store.bucket, Key=key, ChecksumMode="ENABLED")
    assert head.get("ChecksumSHA256", "").endswith("-2")  # stored as a 2-part upload with part checksums
    model = entry(art, "model.pt")
    forge(store, key, model.size, model.sha256)
    states = {o.path: o.state for o in verify_artifact(art, store_for(store)).objects}
    assert states["model.pt"] == "changed"
    report = prune_verified([art], store_for(store))
    assert report.removed == [] and (art / "model.pt").stat().st_size == model.size


def test_file_archive_overwritten_in_place_fails_verify_and_keeps_the_copy(artifact, tmp_path):
    store = LocalStore(tmp_path / "archive")
    store.root.mkdir()
    assert run_probe(store, "scratch").record.passed
    publish_artifact(artifact, store, UPLOAD_PREFIX, progress=False)
    (artifact / "optim.pt").unlink()
    obj = tmp_path / "archive" / ARTIFACT_PREFIX / "optim" / "__1_0.distcp"
    with open(obj, "r+b") as fh:
        fh.write(b"\0" * 64)
    states = {o.path: o.state for o in verify_artifact(artifact, store_for(store)).objects}
    assert states["optim/__1_0.distcp"] == "mismatch"  # its bytes, read back, are not the declared ones
    report = prune_verified([artifact], store_for(store))
    assert report.removed == [] and all((artifact / p).exists() for p in PAYLOAD)


def test_publish_records_the_server_checksums_it_saw(published, qualified):
    rec = receipt_record.read_receipt(published)
    assert set(rec.server_checksums) == {e.path for e in rec.files}


def test_an_endpoint_without_server_checksums_needs_read_data_to_prune(artifact, qualified, seaweedfs_credentials_path):
    # The same endpoint and bucket (so the probe record holds), opened as one that computes no checksums.
    plain = S3Store(qualified.bucket, load_credentials(seaweedfs_credentials_path), checksum_sha256=False)
    publish_artifact(artifact, plain, UPLOAD_PREFIX, progress=False)
    (artifact / "optim.pt").unlink()
    assert receipt_record.read_receipt(artifact).server_checksums == {}
    states = {o.state for o in verify_artifact(artifact, store_for(plain)).objects[1:]}
    assert states == {"unverifiable"}
    assert verify_artifact(artifact, store_for(plain), read_data=True).ok
    kept = prune_verified([artifact], store_for(plain))
    assert kept.removed == [] and "--read-data" in kept.kept[0]["reason"]
    done = prune_verified([artifact], store_for(plain), read_data=True)
    assert [r["files"] for r in done.removed] == [PAYLOAD]


def test_an_older_receipt_without_server_checksums_needs_read_data(published, qualified):
    path = receipt_record.path_in(published)
    data = json.loads(path.read_bytes())
    del data["server_checksums"]
    path.write_text(json.dumps(data))
    assert receipt_record.read_receipt(published).server_checksums is None
    result = verify_artifact(published, store_for(qualified))
    assert {o.state for o in result.objects[1:]} == {"unverifiable"} and not result.ok
    # Nothing seen is wrong with the copy: the remedy is to read it, not to republish it elsewhere.
    assert "--read-data" in result.failure_line() and "republish" not in result.failure_line()
    assert prune_verified([published], store_for(qualified)).removed == []
    again = publish_artifact(published, qualified, UPLOAD_PREFIX, progress=False)  # rewrites it with them
    assert again.status == "skipped" and receipt_record.read_receipt(published).server_checksums
    data = json.loads(path.read_bytes())
    del data["server_checksums"]
    path.write_text(json.dumps(data))
    assert prune_verified([published], store_for(qualified), read_data=True).freed_bytes > 0


def test_delete_local_reads_back_what_no_server_checksum_proves(tmp_path, qualified, seaweedfs_credentials_path):
    plain = S3Store(qualified.bucket, load_credentials(seaweedfs_credentials_path), checksum_sha256=False)
    local = LocalStore(tmp_path / "archive")
    local.root.mkdir()
    assert run_probe(local, "scratch").record.passed
    for i, store in enumerate((plain, local)):
        art = make_artifact(tmp_path / f"run{i}")
        (art / "optim.pt").unlink()
        result = publish_artifact(art, store, UPLOAD_PREFIX, delete_local=True, progress=False)
        assert receipt_record.read_receipt(art).server_checksums == {}
        assert sorted(result.removed) == PAYLOAD and not any((art / p).exists() for p in PAYLOAD)


# ------------------------------------------------------------------ the unlinked file is the checked one (defect 7)


def prune_cli(artifact, creds, tmp_path, *, pause: bool):
    env = {"CKPTFLOW_TEST_PAUSE_AT": "release:before-unlink", "CKPTFLOW_TEST_PAUSE_FILE": str(tmp_path / "pause")} if pause else {}
    return start_cli("prune-verified", "--paths", str(artifact), "--credentials", str(creds), env=env)


def test_a_payload_resaved_after_the_check_is_not_deleted(published, seaweedfs_credentials_path, tmp_path):
    proc = prune_cli(published, seaweedfs_credentials_path, tmp_path, pause=True)
    wait_for_file(tmp_path / "pause", proc)
    new = published / ".model.pt.writer.tmp"
    new.write_bytes(b"re-saved by the trainer")
    os.replace(new, published / "model.pt")  # an atomic re-save while prune waits
    (tmp_path / "pause").unlink()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    report = json.loads(out)
    validate(report, "report_prune_verified", what="prune report")
    assert (published / "model.pt").read_bytes() == b"re-saved by the trainer"
    removed = [f for r in report["removed"] for f in r["files"]]
    assert "model.pt" not in removed and sorted(removed) == PAYLOAD[1:]
    assert report["freed_bytes"] == sum(entry(published, p).size for p in PAYLOAD[1:])
    assert any("model.pt" in k["reason"] for k in report["kept"])


# ------------------------------------------------------------------ whole reports, concurrent prunes (defect 9)


def test_a_failing_path_does_not_hide_what_was_already_removed(tmp_path, qualified):
    a = make_artifact(tmp_path / "run1", iteration=5)
    b = make_artifact(tmp_path / "run1", iteration=6, seed=1)
    for art in (a, b):
        publish_artifact(art, qualified, UPLOAD_PREFIX, progress=False)
        (art / "optim.pt").unlink()
    (b / "stray").symlink_to("model.pt")
    report = prune_verified([a, b], store_for(qualified))
    assert [r["path"] for r in report.removed] == [str(a)] and report.removed[0]["files"] == PAYLOAD
    assert [k["path"] for k in report.kept] == [str(b)] and "symlink" in report.kept[0]["reason"]
    assert all((b / p).exists() for p in PAYLOAD)


@pytest.mark.slow
def test_two_prunes_of_one_artifact_both_end_cleanly(published, seaweedfs_credentials_path, tmp_path):
    first = prune_cli(published, seaweedfs_credentials_path, tmp_path, pause=True)
    wait_for_file(tmp_path / "pause", first)
    second = prune_cli(published, seaweedfs_credentials_path, tmp_path, pause=False)
    out2, err2 = second.communicate(timeout=120)
    (tmp_path / "pause").unlink()
    out1, err1 = first.communicate(timeout=120)
    assert second.returncode == 0, err2
    assert first.returncode == 0, err1
    reports = [json.loads(out1), json.loads(out2)]
    for report in reports:
        validate(report, "report_prune_verified", what="prune report")
    removed = sorted(f for r in reports for x in r["removed"] for f in x["files"])
    assert removed == PAYLOAD  # each file counted once, by the prune that removed it
    assert sum(r["freed_bytes"] for r in reports) == sum(entry(published, p).size for p in PAYLOAD)
    assert not any((published / p).exists() for p in PAYLOAD)


# ------------------------------------------------------------------ receipts bound to their artifact


def test_a_receipt_copied_from_another_artifact_does_not_authorize_pruning(tmp_path, qualified):
    five = make_artifact(tmp_path / "run1", iteration=5)
    six = make_artifact(tmp_path / "run1", iteration=6)  # the same payload bytes, another iteration
    publish_artifact(six, qualified, UPLOAD_PREFIX, progress=False)
    for art in (five, six):
        (art / "optim.pt").unlink()
    shutil.copy(receipt_record.path_in(six), receipt_record.path_in(five))
    report = prune_verified([five], store_for(qualified))
    assert report.removed == [] and "iter_000006" in report.kept[0]["reason"]
    assert all((five / p).exists() for p in PAYLOAD)


@pytest.mark.parametrize("where", ["contains", "inside"])
def test_a_file_archive_overlapping_the_artifact_is_refused(artifact, where):
    run_dir = artifact.parents[1]
    root = run_dir if where == "contains" else artifact / "archive"
    root.mkdir(exist_ok=True)
    before = tree_bytes(artifact)
    with pytest.raises(Refused, match="overlaps"):
        publish_artifact(artifact, LocalStore(root), "checkpoints", progress=False)
    assert tree_bytes(artifact) == before


# ------------------------------------------------------------------ receipts that bind no digest to a payload


def _full_checkpoint_receipt(artifact):
    """What a full-checkpoint upload writes, for this very directory and destination: bulk files size-only."""
    from ckptflow.trainer.retention import write_checkpoint_receipt

    destination = receipt_record.read_receipt(artifact).destination
    write_checkpoint_receipt(artifact, destination, overrides=[".posttrain-checkpoint-artifact.json"])


def _undigested_artifact_receipt(artifact):
    path = receipt_record.path_in(artifact)
    data = json.loads(path.read_bytes())
    del next(e for e in data["files"] if e["path"] == "model.pt")["sha256"]
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("damage, reason", [
    (_full_checkpoint_receipt, "full-checkpoint receipt"),
    (_undigested_artifact_receipt, "'sha256' is a required property"),
], ids=["full_checkpoint_receipt", "entry_without_digest"])
def test_a_receipt_without_every_digest_never_releases_a_byte(published, qualified, seaweedfs_credentials_path,
                                                            tmp_path, damage, reason):
    from ckptflow.archive.publish import delete_verified_payloads
    from ckptflow.records.manifest import read_manifest

    damage(published)
    before = tree_bytes(published)
    report = prune_verified([published], store_for(qualified), read_data=True)
    assert report.removed == [] and report.freed_bytes == 0 and reason in report.kept[0]["reason"]
    proc = prune_cli(published, seaweedfs_credentials_path, tmp_path, pause=False)
    out, err = proc.communicate(timeout=120)
    cli = json.loads(out)
    assert cli["removed"] == [] and reason in cli["kept"][0]["reason"], err
    with pytest.raises(InvalidRecord, match=re.escape(reason)):
        verify_artifact(published, store_for(qualified))
    with pytest.raises(InvalidRecord, match=re.escape(reason)):
        delete_verified_payloads(published, read_manifest(published), qualified, False)
    assert tree_bytes(published) == before
