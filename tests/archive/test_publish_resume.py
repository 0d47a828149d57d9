"""A real `ckptflow publish` of a large file SIGKILLed mid-upload, then run again: it resumes the killed
multipart upload (only missing parts are sent), and no unfinished upload is left behind. On SeaweedFS,
whose ListParts reports each part's MD5 ETag but no SHA-256."""

from __future__ import annotations

import json
import signal
import time

import pytest
from test_publish_processes import assert_remote_matches_declaration, publish_args

from ckptflow.jsonio import validate
from ckptflow.records import receipt as receipt_record
from helpers import servers
from helpers.artifacts import ARTIFACT_PREFIX, make_artifact
from helpers.cli import run_cli, start_cli, wait_for_file

# A killed upload's parts settle on the server at the speed the machine allows: run apart from the
# memory-heavy tests (the Slurm tests have their own worker).
pytestmark = pytest.mark.alone

MiB = 1024 * 1024
MODEL_BYTES = 256 * MiB  # 32 parts of the default 8 MiB
PART = 8 * MiB
KILL_AFTER = 12  # parts 1..12 stored: more than a third


def pending(creds, bucket) -> list[dict]:
    listed = servers.s3_client(creds).list_multipart_uploads(Bucket=bucket, Prefix=ARTIFACT_PREFIX + "/")
    return listed.get("Uploads", [])


@pytest.fixture
def big_artifact(tmp_path):
    return make_artifact(tmp_path / "run1", model_bytes=MODEL_BYTES)


def _killed(big_artifact, sw_store, creds):
    args = publish_args(big_artifact, sw_store.bucket, creds)
    killed = run_cli(*args, env={"CKPTFLOW_TEST_KILL_AT": f"upload:part-{KILL_AFTER}-stored"})
    assert killed.returncode == -signal.SIGKILL
    [left] = pending(creds, sw_store.bucket)
    assert left["Key"] == f"{ARTIFACT_PREFIX}/model.pt"
    # A part whose bytes were all sent before the kill may still be stored by the server just after it:
    # count once the listing has settled.
    counts = [-1]
    while True:
        listed = servers.s3_client(creds).list_parts(Bucket=sw_store.bucket, Key=left["Key"],
                                                     UploadId=left["UploadId"])
        counts.append(len(listed["Parts"]))
        if counts[-1] == counts[-2]:
            break
        time.sleep(1.0)
    assert counts[-1] >= KILL_AFTER
    return args, left["UploadId"], counts[-1]


@pytest.mark.slow
def test_a_killed_publish_resumes_its_upload_and_sends_only_the_missing_parts(
        big_artifact, sw_store, seaweedfs_credentials_path, probe_cache):
    creds = seaweedfs_credentials_path
    args, upload_id, stored = _killed(big_artifact, sw_store, creds)
    [entry] = (probe_cache / "uploads").glob("*.json")  # the killed run's journal, outside the artifact
    assert json.loads(entry.read_text())["upload_id"] == upload_id
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    report = rerun.report
    validate(report, "report_publish", what="publish report")
    assert report["status"] == "published"
    [resumed] = report["resumed_uploads"]
    assert (resumed["path"], resumed["upload_id"], resumed["reused_parts"]) == ("model.pt", upload_id, stored)
    assert resumed["reused_bytes"] == stored * PART
    # Only the missing parts (and the small files, which go after the large one) went on the wire.
    assert report["sent_bytes"] == report["uploaded_bytes"] - stored * PART
    assert report["sent_bytes"] <= report["uploaded_bytes"] - KILL_AFTER * PART
    assert report["aborted_uploads"] == []
    assert pending(creds, sw_store.bucket) == []
    assert list((probe_cache / "uploads").iterdir()) == []
    assert_remote_matches_declaration(sw_store)
    assert sw_store.head(f"{ARTIFACT_PREFIX}/model.pt").checksum.endswith("-32")  # the composite binds every part
    ver = run_cli("verify", "--artifact-dir", str(big_artifact), "--credentials", str(creds), "--read-data")
    assert ver.returncode == 0 and ver.report["status"] == "verified", ver.stderr


@pytest.mark.slow
def test_a_file_changed_between_the_kill_and_the_rerun_reuses_nothing(
        big_artifact, sw_store, seaweedfs_credentials_path):
    creds = seaweedfs_credentials_path
    args, upload_id, _ = _killed(big_artifact, sw_store, creds)
    with open(big_artifact / "model.pt", "r+b") as fh:  # same size; a byte of a stored part differs
        fh.seek(3 * PART + 5)
        byte = fh.read(1)
        fh.seek(3 * PART + 5)
        fh.write(bytes([byte[0] ^ 0xFF]))
    rerun = run_cli(*args)
    assert rerun.returncode == 1 and rerun.report["status"] == "refused"
    assert "contradicts" in rerun.stderr and "model.pt" in rerun.stderr  # refused as before any upload
    assert sw_store.head(f"{ARTIFACT_PREFIX}/model.pt") is None
    assert not receipt_record.path_in(big_artifact).exists()
    # What the operator cleans up: the killed run's upload, found by age.
    gc = run_cli("gc-uploads", "--bucket", sw_store.bucket, "--credentials", str(creds),
                 "--prefix", ARTIFACT_PREFIX + "/", "--older-than", "0s", "--force-age")
    assert gc.returncode == 0, gc.stderr
    validate(gc.report, "report_gc_uploads", what="gc-uploads report")
    assert [a["upload_id"] for a in gc.report["aborted"]] == [upload_id]
    assert pending(creds, sw_store.bucket) == []


@pytest.mark.slow
def test_two_resuming_publishers_racing_mid_upload_both_succeed(
        big_artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    """The first holds mid-upload; the second sees its upload live, sends its own and aborts nothing;
    the first then completes. One consistent archive, nothing left unfinished."""
    creds = seaweedfs_credentials_path
    flag = tmp_path / "paused"
    args = publish_args(big_artifact, sw_store.bucket, creds)
    first = start_cli(*args, env={"CKPTFLOW_TEST_PAUSE_AT": "upload:part-6-stored",
                                  "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    wait_for_file(flag, first)
    second = run_cli(*args)
    assert second.returncode == 0, second.stderr
    assert second.report["resumed_uploads"] == [] and second.report["aborted_uploads"] == []
    assert len(pending(creds, sw_store.bucket)) == 1  # the first one's, left alone
    flag.unlink()
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads(out)["status"] in {"published", "adopted"}
    assert pending(creds, sw_store.bucket) == []
    assert_remote_matches_declaration(sw_store)


@pytest.mark.slow
def test_a_stale_foreign_upload_is_aborted_by_publish_and_listed(sw_store, seaweedfs_credentials_path, tmp_path):
    """An unfinished upload under the prefix that this machine's journal does not name is aborted once
    older than --stale-upload-age (and kept while younger: it may be another machine's live upload)."""
    creds = seaweedfs_credentials_path
    art = make_artifact(tmp_path / "run1")
    client = servers.s3_client(creds)
    key = f"{ARTIFACT_PREFIX}/model.pt"
    foreign = client.create_multipart_upload(Bucket=sw_store.bucket, Key=key)["UploadId"]
    first = run_cli(*publish_args(art, sw_store.bucket, creds))
    assert first.returncode == 0 and first.report["aborted_uploads"] == []
    assert [u["UploadId"] for u in pending(creds, sw_store.bucket)] == [foreign]
    again = run_cli(*publish_args(art, sw_store.bucket, creds, "--stale-upload-age", "0s"))
    assert again.returncode == 0 and again.report["status"] == "skipped"
    [aborted] = again.report["aborted_uploads"]
    assert (aborted["path"], aborted["upload_id"]) == ("model.pt", foreign)
    assert pending(creds, sw_store.bucket) == []


def test_the_terminal_summaries_say_what_was_resumed_and_aborted():
    from ckptflow.commands import summary
    from ckptflow.commands.gc_uploads import parse_age
    from ckptflow.errors import UsageError

    assert [parse_age(v) for v in ("90", "90s", "30m", "24h", "7d", "0.5h")] == [90, 90, 1800, 86400, 604800, 1800]
    with pytest.raises(UsageError, match="24h"):
        parse_age("a day")
    row = {"key": "p/model.pt", "upload_id": "u1", "initiated": "2026-12-01T00:00:00Z", "parts": 2,
           "stored_bytes": 2 * MiB, "reason": "unfinished for 90 s"}
    gc = {"status": "dry-run", "destination": {"scheme": "s3", "endpoint": "127.0.0.1:18333", "bucket": "b"},
          "prefix": "p/", "scope": "prefix", "older_than_s": 60.0, "aborted": [row], "kept": []}
    validate(gc, "report_gc_uploads", what="gc-uploads report")
    text = summary.render("gc-uploads", gc, 1.0)
    assert text.startswith("dry run: would abort 1 unfinished upload; nothing was aborted")
    assert "p/model.pt (started 2026-12-01T00:00:00Z, 2 parts stored, 2.00 MiB)" in text and "s3://b/p/ at 127.0.0.1:18333" in text
    pub = {"status": "published", "artifact_dir": "/a/iter_000300",
           "destination": {"scheme": "s3", "endpoint": "h", "bucket": "b", "prefix": "p"},
           "declaration_sha256": "0" * 64, "inventory": [{"path": "model.pt", "size": 3 * MiB, "sha256": "0" * 64}],
           "uploaded": ["model.pt"], "uploaded_bytes": 3 * MiB, "removed": [], "freed_bytes": 0,
           "sent_bytes": MiB, "resumed_uploads": [{"path": "model.pt", "upload_id": "u", "reused_parts": 2,
                                                   "reused_bytes": 2 * MiB}],
           "aborted_uploads": [dict(row, path="model.pt")]}
    validate(pub, "report_publish", what="publish report")
    text = summary.render("publish", pub, 1.0)
    assert "1 killed upload: 2.00 MiB already stored, 1.00 MiB sent" in text
    assert "model.pt (unfinished for 90 s)" in text
