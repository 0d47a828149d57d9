"""`ckptflow gc-uploads` on a real SeaweedFS with real multipart uploads: a prefix is whole path segments,
a broader scope must be named, young uploads (possibly another host's live publisher) are protected by
an age floor measured on the server's clock, and a terminal run only lists."""

from __future__ import annotations

import os

import pytest

from ckptflow.jsonio import validate
from helpers import servers
from helpers.cli import run_cli, run_on_terminal

PART = 5 * 1024 * 1024  # S3's smallest non-final part


def _start(client, bucket: str, key: str, parts: int = 1) -> str:
    """An unfinished multipart upload of ``key`` holding ``parts`` stored parts of PART bytes."""
    upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
    for n in range(1, parts + 1):
        client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=n, Body=os.urandom(PART))
    return upload


def _pending(client, bucket: str) -> dict[str, str]:
    return {u["UploadId"]: u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])}


@pytest.fixture
def uploads(seaweedfs_bucket, seaweedfs_credentials_path, probe_cache):
    """This run's uploads beside a sibling run's and another tool's, whose names share the prefix's text."""
    client = servers.s3_client(seaweedfs_credentials_path)
    made = {key: _start(client, seaweedfs_bucket, key, parts)
            for key, parts in (("proj/g/run1/iter_000300/model.pt", 2), ("proj/g/run10/iter_000300/model.pt", 1),
                               ("proj/g/run1-backup/dataset.tar", 1), ("proj/run1/model.pt", 1),
                               ("proj/run10/model.pt", 1), ("proj/run1-backup/dataset.tar", 1))}
    before = _pending(client, seaweedfs_bucket)
    assert sorted(before.values()) == sorted(made)
    return client, seaweedfs_bucket, made, before


def _gc(bucket, creds, *args):
    return run_cli("gc-uploads", "--bucket", bucket, "--credentials", str(creds), *args)


@pytest.mark.seaweedfs
def test_a_prefix_is_whole_segments_and_the_report_lists_what_each_upload_stores(uploads, seaweedfs_credentials_path):
    client, bucket, made, before = uploads
    gc = _gc(bucket, seaweedfs_credentials_path, "--prefix", "proj/g/run1", "--older-than", "0s", "--force-age",
             "--abort")
    assert gc.returncode == 0, gc.stderr
    validate(gc.report, "report_gc_uploads", what="gc-uploads report")
    assert gc.report["prefix"] == "proj/g/run1/" and gc.report["status"] == "done"
    [row] = gc.report["aborted"]
    key = "proj/g/run1/iter_000300/model.pt"
    assert (row["key"], row["upload_id"], row["parts"], row["stored_bytes"]) == (key, made[key], 2, 2 * PART)
    assert row["initiated"].endswith("Z") and gc.report["kept"] == []
    after = _pending(client, bucket)
    assert after == {u: k for u, k in before.items() if k != key}  # run10 and run1-backup untouched


@pytest.mark.seaweedfs
@pytest.mark.parametrize("args", [
    ["--prefix", "proj/run1"],  # fewer segments than <project>/<group>/<run>/
    ["--prefix", "proj/g/"],
    [],  # the whole bucket
    ["--prefix", ""],
    ["--prefix", "/"],
    ["--scope", "bucket", "--prefix", "proj/g/run1"],  # a scope that does not say what is swept
    ["--prefix", "proj/g/run1", "--older-than", "30m"],  # below the age floor
    ["--prefix", "proj/g/run1", "--older-than", "0s"],
])
def test_a_broad_prefix_or_a_young_age_is_refused_and_nothing_is_aborted(uploads, seaweedfs_credentials_path, args):
    client, bucket, _, before = uploads
    extra = [] if "--older-than" in args else ["--older-than", "0s", "--force-age"]
    gc = _gc(bucket, seaweedfs_credentials_path, *args, *extra, "--abort")
    assert gc.returncode == 2, gc.stderr
    assert gc.report["status"] == "usage-error"
    assert any(word in gc.stderr for word in ("--scope", "--force-age")), gc.stderr
    assert _pending(client, bucket) == before


@pytest.mark.seaweedfs
@pytest.mark.slow
def test_a_named_broader_scope_sweeps_whole_segments_only(uploads, seaweedfs_credentials_path):
    client, bucket, made, before = uploads
    gc = _gc(bucket, seaweedfs_credentials_path, "--prefix", "proj/run1", "--scope", "prefix",
             "--older-than", "0s", "--force-age", "--abort")
    assert gc.returncode == 0, gc.stderr
    assert [a["key"] for a in gc.report["aborted"]] == ["proj/run1/model.pt"]
    assert _pending(client, bucket) == {u: k for u, k in before.items() if k != "proj/run1/model.pt"}
    dry = _gc(bucket, seaweedfs_credentials_path, "--scope", "bucket", "--older-than", "0s", "--force-age",
              "--dry-run")
    assert dry.returncode == 0 and dry.report["status"] == "dry-run", dry.stderr
    assert sorted(a["key"] for a in dry.report["aborted"]) == sorted(k for k in made if k != "proj/run1/model.pt")
    assert _pending(client, bucket) == {u: k for u, k in before.items() if k != "proj/run1/model.pt"}


@pytest.mark.seaweedfs
def test_uploads_younger_than_the_bound_on_the_servers_clock_are_kept(uploads, seaweedfs_credentials_path):
    """Seconds-old uploads (a live publisher elsewhere, for all this machine knows) survive the default
    bound and the floor; the age is the server's, so the report says how long ago the server started it."""
    client, bucket, _, before = uploads
    gc = _gc(bucket, seaweedfs_credentials_path, "--prefix", "proj/g/run1/", "--older-than", "1h", "--abort")
    assert gc.returncode == 0, gc.stderr
    assert gc.report["aborted"] == []
    [kept] = gc.report["kept"]
    assert "elsewhere" in kept["reason"] and kept["stored_bytes"] == 2 * PART
    assert _pending(client, bucket) == before


@pytest.mark.seaweedfs
def test_on_a_terminal_it_lists_what_it_would_abort_and_aborts_nothing(uploads, seaweedfs_credentials_path):
    client, bucket, _, before = uploads
    gc = run_on_terminal("gc-uploads", "--bucket", bucket, "--credentials", str(seaweedfs_credentials_path),
                         "--prefix", "proj/g/run1", "--older-than", "0s", "--force-age")
    assert gc.returncode == 0, gc.stderr
    assert gc.stdout.startswith("dry run: would abort 1 unfinished upload; nothing was aborted"), gc.stdout
    assert "--abort" in gc.stdout and "proj/g/run1/iter_000300/model.pt" in gc.stdout
    assert "2 parts stored, 10.0 MiB" in gc.stdout
    assert _pending(client, bucket) == before
