"""probe: passes on an endpoint that enforces create-once (SeaweedFS, file://), fails closed on s3rver."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ckptflow.archive.probe import require_qualified, run_probe
from ckptflow.errors import EndpointNotQualified
from ckptflow.records import probe as probe_record
from ckptflow.store.credentials import load_credentials
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from helpers.cli import run_cli


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def ckptflow(*args, env=None):
    proc = run_cli(*args, env=env, timeout=120)
    return proc, proc.report


def test_probe_passes_on_seaweedfs_and_cleans_up(seaweedfs_bucket, seaweedfs_credentials_path):
    proc, report = ckptflow("probe", "--bucket", seaweedfs_bucket, "--prefix", "team/run",
                            "--credentials", str(seaweedfs_credentials_path))
    assert proc.returncode == 0, proc.stderr
    assert report["status"] == "passed" and report["reasons"] == []
    assert report["results"] == {
        "create_once_refused_second_write": True,
        "concurrent_creators": 8,
        "concurrent_winners": 1,
        "sha256_metadata_roundtrip": True,
        "checksum_sha256": "rejected-wrong",
        "part_checksum_sha256": "enforced",
    }
    assert report["destination"] == {"scheme": "s3", "endpoint": "127.0.0.1:18333", "bucket": seaweedfs_bucket}
    store = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path))
    assert store.list("team/") == []  # scratch keys removed
    record = probe_record.read_probe_record(store.destination)
    assert record is not None and record.passed
    assert "ckptflow-test-secret" not in Path(report["record"]).read_text()


def test_probe_fails_on_a_server_that_ignores_if_none_match(s3rver_bucket, s3rver_credentials_path):
    proc, report = ckptflow("probe", "--bucket", s3rver_bucket, "--prefix", "team/run",
                            "--credentials", str(s3rver_credentials_path))
    assert proc.returncode == 1
    assert report["status"] == "failed" and report["results"]["create_once_refused_second_write"] is False
    assert report["results"]["part_checksum_sha256"] == "not-enforced"
    assert "127.0.0.1:18334" in proc.stderr and "create-once" in proc.stderr
    assert proc.stderr.count("\n") == 1


# Objects the probe must never delete: the run's artifacts, another probe's scratch under the same
# prefix, and a sibling prefix that merely starts with the same characters.
OTHERS = {
    "team/run/checkpoint_artifacts/iter_000001/model.pt": b"an archived payload",
    "team/run/.ckptflow-probe/20260101T000000Z-0123abcd/create-once": b"another probe's scratch",
    "team/run1/notes.txt": b"a sibling run",
}


def test_probe_removes_only_its_own_scratch_keys(seaweedfs_bucket, seaweedfs_credentials_path, tmp_path):
    s3 = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path))
    root = tmp_path / "archive"
    root.mkdir()
    local = LocalStore(root)
    for store in (s3, local):
        for key, data in OTHERS.items():
            assert store.put_bytes_create_once(key, data, sha256=hashlib.sha256(data).hexdigest())
    proc, report = ckptflow("probe", "--bucket", seaweedfs_bucket, "--prefix", "team/run",
                            "--credentials", str(seaweedfs_credentials_path))
    assert proc.returncode == 0 and report["status"] == "passed", proc.stderr
    assert run_probe(local, "team/run").record.passed
    for store in (s3, local):
        assert [info.key for info in store.list("team/")] == sorted(OTHERS)
        assert {key: store.get_bytes(key) for key in OTHERS} == OTHERS


def test_file_archive_probe_passes(tmp_path):
    root = tmp_path / "archive"
    root.mkdir()
    outcome = run_probe(LocalStore(root), "team")
    assert outcome.record.passed, outcome.reasons
    assert outcome.record.results.checksum_sha256 == "not-offered"
    assert outcome.record.results.part_checksum_sha256 == "not-offered"


def test_require_qualified_runs_the_probe_once_and_then_uses_the_cache(seaweedfs_bucket, seaweedfs_credentials_path):
    store = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path))
    first = require_qualified(store, "team")
    assert require_qualified(store, "team", auto_probe=False).checked_at == first.checked_at


def test_require_qualified_refuses_an_unqualified_endpoint_by_name(s3rver_bucket, s3rver_credentials_path):
    store = S3Store(s3rver_bucket, load_credentials(s3rver_credentials_path))
    with pytest.raises(EndpointNotQualified, match=r"127\.0\.0\.1:18334"):
        require_qualified(store, "team")


def test_no_cached_record_and_no_auto_probe_is_refused(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(EndpointNotQualified, match="ckptflow probe"):
        require_qualified(LocalStore(tmp_path / "a"), "p", auto_probe=False)
