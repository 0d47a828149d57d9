"""Resuming the multipart upload a killed run left, and aborting the unusable ones: the decision logic on
moto (parts checked here, ETags of MD5) and on SeaweedFS (parts checked by the server)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckptflow.digest import FileDigest, sha256_bytes, sha256_file
from ckptflow.errors import VerificationFailed
from ckptflow.store import S3Store, load_credentials, s3_uploads
from ckptflow.store.base import UploadLog

MiB = 1024 * 1024
PART = 5 * MiB


@pytest.fixture(autouse=True)
def journal_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def moto_store(moto_s3) -> S3Store:
    return S3Store(moto_s3.bucket, moto_s3.credentials, multipart_threshold=PART, part_size=PART)


@pytest.fixture
def sw_small(seaweedfs_bucket, seaweedfs_credentials_path) -> S3Store:
    return S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path), multipart_threshold=PART,
                   part_size=PART)


def _file(tmp_path: Path, size: int = 17 * MiB, seed: int = 1) -> tuple[Path, bytes]:
    data = hashlib.sha256(str(seed).encode()).digest() * (size // 32) + b"x" * (size % 32)
    path = tmp_path / f"big-{seed}.bin"
    path.write_bytes(data)
    return path, data


def _checked(store: S3Store, size: int) -> bool:
    return store.part_digest_size(size) is not None and store.part_checksums_enforced("check")


def leave_killed_upload(store: S3Store, key: str, data: bytes, parts: dict[int, bytes] | None = None,
                        *, numbers: tuple[int, ...] = (1, 2), sha256: str | None = None) -> str:
    """What a run killed after storing ``numbers`` leaves: an unfinished upload and its journal entry
    (``parts`` overrides the bytes stored for a part number)."""
    checked = _checked(store, len(data))
    client = store._client
    extra = {"ChecksumAlgorithm": "SHA256"} if checked else {}
    upload_id = client.create_multipart_upload(Bucket=store.bucket, Key=key, Metadata={"sha256": sha256_bytes(data)},
                                               **extra)["UploadId"]
    for n in numbers:
        body = (parts or {}).get(n, data[(n - 1) * PART:n * PART])
        sums = {"ChecksumSHA256": base64.b64encode(hashlib.sha256(body).digest()).decode()} if checked else {}
        client.upload_part(Bucket=store.bucket, Key=key, UploadId=upload_id, PartNumber=n, Body=body, **sums)
    held = s3_uploads.claim(store.destination, key)
    held.write(s3_uploads.UploadEntry(upload_id, len(data), sha256 or sha256_bytes(data), PART, checked,
                                      "2026-12-01T00:00:00Z"))
    held.release()
    return upload_id


def _digest(store: S3Store, key: str, path: Path) -> FileDigest:
    size = path.stat().st_size
    return sha256_file(path, part_size=store.part_digest_size(size), md5_part_size=store.resumable_part_size(key, size))


def _pending(store: S3Store) -> list[str]:
    return [u.upload_id for u in store.list_uploads("")]


def _resume_sends_only_missing_parts(store: S3Store, tmp_path: Path) -> None:
    src, data = _file(tmp_path)
    upload_id = leave_killed_upload(store, "a/big.bin", data)
    assert store.resumable_part_size("a/big.bin", len(data)) == PART
    digest = _digest(store, "a/big.bin", src)
    assert digest.part_md5 is not None and len(digest.part_md5) == 4
    log = UploadLog()
    info = store.put_files([("a/big.bin", src, digest)], uploads=log)[0]
    assert (info.size, info.sha256) == (len(data), digest.sha256)
    assert log.resumed == [{"key": "a/big.bin", "upload_id": upload_id, "reused_parts": 2,
                            "reused_bytes": 2 * PART, "listed_parts": 2}]
    assert log.sent_bytes == len(data) - 2 * PART and log.aborted == []
    assert store.get_bytes("a/big.bin") == data
    assert _pending(store) == []
    assert list(s3_uploads.journal_dir().iterdir()) == []  # completed: forgotten, lock file included


def test_moto_resume_sends_only_the_missing_parts(moto_store, tmp_path) -> None:
    _resume_sends_only_missing_parts(moto_store, tmp_path)


@pytest.mark.seaweedfs
def test_seaweedfs_resume_proves_parts_by_their_md5_etag(sw_small, tmp_path) -> None:
    assert _checked(sw_small, 17 * MiB)  # parts carry ChecksumSHA256, but ListParts reports only ETags
    _resume_sends_only_missing_parts(sw_small, tmp_path)


def _a_part_holding_other_bytes_is_sent_again(store: S3Store, tmp_path: Path) -> None:
    src, data = _file(tmp_path)
    leave_killed_upload(store, "k", data, {2: b"\0" * PART})
    log = UploadLog()
    store.put_files([("k", src, _digest(store, "k", src))], uploads=log)
    assert log.resumed[0]["reused_parts"] == 1 and log.sent_bytes == len(data) - PART
    assert store.get_bytes("k") == data and _pending(store) == []


def test_moto_a_stored_part_with_other_bytes_is_sent_again(moto_store, tmp_path) -> None:
    _a_part_holding_other_bytes_is_sent_again(moto_store, tmp_path)


@pytest.mark.seaweedfs
def test_seaweedfs_a_stored_part_with_other_bytes_is_sent_again(sw_small, tmp_path) -> None:
    _a_part_holding_other_bytes_is_sent_again(sw_small, tmp_path)


def test_an_upload_left_for_other_bytes_is_aborted_and_nothing_of_it_reused(moto_store, tmp_path) -> None:
    _old, old_data = _file(tmp_path, seed=1)
    stale = leave_killed_upload(moto_store, "k", old_data)
    src, data = _file(tmp_path, seed=2)  # the file was rewritten between the kill and the rerun
    digest = _digest(moto_store, "k", src)
    assert digest.part_md5 is not None  # same size: the MD5 pass is taken before the digest is known
    log = UploadLog()
    moto_store.put_files([("k", src, digest)], uploads=log)
    assert log.resumed == [] and [a["upload_id"] for a in log.aborted] == [stale]
    assert "other bytes" in log.aborted[0]["reason"] and log.sent_bytes == len(data)
    assert moto_store.get_bytes("k") == data and _pending(moto_store) == []


def test_without_the_md5_pass_no_part_is_proven(moto_store, tmp_path) -> None:
    src, data = _file(tmp_path)
    leave_killed_upload(moto_store, "k", data)
    log = UploadLog()
    moto_store.put_files([("k", src, sha256_file(src))], uploads=log)
    assert log.resumed[0]["reused_parts"] == 0 and log.sent_bytes == len(data)
    assert moto_store.get_bytes("k") == data and _pending(moto_store) == []


def test_a_file_changed_after_hashing_inside_a_reused_part_is_refused(moto_store, tmp_path) -> None:
    """Parts checked here: the reused parts' local bytes are hashed in order with the sent ones, so a
    change after the hashing pass fails the upload even where no byte of it is sent."""
    src, data = _file(tmp_path)
    leave_killed_upload(moto_store, "k", data)
    digest = _digest(moto_store, "k", src)
    with open(src, "r+b") as fh:
        fh.seek(PART + 7)
        fh.write(b"\xff")
    with pytest.raises(VerificationFailed, match="changed after it was hashed"):
        moto_store.put_files([("k", src, digest)], uploads=UploadLog())
    assert moto_store.head("k") is None and _pending(moto_store) == []
    assert list(s3_uploads.journal_dir().iterdir()) == []  # aborted, forgotten and released


def test_an_upload_a_live_process_holds_is_neither_resumed_nor_aborted(moto_store, tmp_path) -> None:
    src, data = _file(tmp_path)
    live = leave_killed_upload(moto_store, "k", data)
    held = s3_uploads.claim(moto_store.destination, "k")  # another publisher uploading this key right now
    try:
        assert s3_uploads.claim(moto_store.destination, "k") is None
        log = UploadLog()
        moto_store.put_files([("k", src, _digest(moto_store, "k", src))], uploads=log)
        assert log.resumed == [] and log.aborted == [] and log.sent_bytes == len(data)
        assert _pending(moto_store) == [live]
        aborted, kept = moto_store.sweep_uploads("", older_than=0, journaled_any_age=True)
        assert aborted == [] and [k["upload_id"] for k in kept] == [live]
        assert "live process" in kept[0]["reason"]
    finally:
        held.release()
    assert moto_store.get_bytes("k") == data


@pytest.mark.seaweedfs
def test_sweep_aborts_only_what_no_live_process_uses_and_is_old_enough(sw_small, tmp_path) -> None:
    """On SeaweedFS: moto reports a fixed 2010 ``Initiated`` for every upload."""
    store = sw_small
    _, data = _file(tmp_path)
    journaled = leave_killed_upload(store, "p/journaled", data, numbers=(1,))
    foreign = store._client.create_multipart_upload(Bucket=store.bucket, Key="p/foreign")["UploadId"]
    outside = store._client.create_multipart_upload(Bucket=store.bucket, Key="q/other")["UploadId"]
    # gc-uploads: nothing is older than an hour; a dry run aborts nothing
    assert store.sweep_uploads("p/", older_than=3600)[0] == []
    aborted, kept = store.sweep_uploads("p/", older_than=0, dry_run=True)
    assert {a["upload_id"] for a in aborted} == {journaled, foreign} and kept == []
    assert set(_pending(store)) == {journaled, foreign, outside}
    # publish after its archive is verified: the journaled one whatever its age, the foreign young one kept
    aborted, kept = store.sweep_uploads("p/", older_than=3600, journaled_any_age=True)
    assert [a["upload_id"] for a in aborted] == [journaled] and [k["upload_id"] for k in kept] == [foreign]
    assert "elsewhere" in kept[0]["reason"]
    assert set(_pending(store)) == {foreign, outside}
    assert s3_uploads.peek(store.destination, "p/journaled") is None
    assert list(s3_uploads.journal_dir().iterdir()) == []
    assert store.list_uploads("p/")[0].initiated > datetime.now(UTC) - timedelta(hours=1)


def test_proven_parts_needs_the_right_size_and_a_matching_checksum() -> None:
    data = os.urandom(2 * PART + 3)
    spans = [data[:PART], data[PART:2 * PART], data[2 * PART:]]
    digest = FileDigest(len(data), sha256_bytes(data), PART, tuple(hashlib.sha256(s).digest() for s in spans),
                        tuple(hashlib.md5(s).digest() for s in spans))
    b64 = [base64.b64encode(hashlib.sha256(s).digest()).decode() for s in spans]
    etag = [f'"{hashlib.md5(s).hexdigest()}"' for s in spans]
    listed = [
        {"PartNumber": 1, "Size": PART, "ETag": etag[0]},  # MD5 ETag only: proven
        {"PartNumber": 2, "Size": PART, "ETag": etag[1], "ChecksumSHA256": b64[0]},  # another sha256: not proven
        {"PartNumber": 3, "Size": 3, "ETag": etag[2], "ChecksumSHA256": b64[2]},  # sha256 matches
        {"PartNumber": 4, "Size": 3, "ETag": etag[2]},  # beyond the file
    ]
    assert s3_uploads.proven_parts(listed, digest, PART) == {1: etag[0], 3: etag[2]}
    assert s3_uploads.proven_parts([{"PartNumber": 1, "Size": PART - 1, "ETag": etag[0]}], digest, PART) == {}
    assert s3_uploads.proven_parts(listed, digest, 2 * PART) == {}  # digests of another part size
    bare = FileDigest(len(data), digest.sha256)
    assert s3_uploads.proven_parts(listed, bare, PART) == {}


def test_a_killed_upload_leaves_its_journal_entry_and_no_lock(moto_store, tmp_path) -> None:
    _, data = _file(tmp_path)
    upload_id = leave_killed_upload(moto_store, "k", data)
    [entry] = s3_uploads.journal_dir().glob("*.json")
    assert json.loads(entry.read_text())["upload_id"] == upload_id
    assert entry.with_suffix(".lock").exists()  # kept while the entry is: it is what tells a live holder
    assert moto_store.upload_is_live("k", upload_id) is False
    assert moto_store.upload_is_live("k", "another") is None
