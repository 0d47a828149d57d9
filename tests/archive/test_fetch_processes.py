"""Real `ckptflow fetch` processes: SIGKILLed mid-way and rerun, raced, and the CLI contract."""

from __future__ import annotations

import json
import signal

import pytest
from archive_helpers import CountingStore

from ckptflow.archive.fetch import fetch_artifact
from ckptflow.archive.publish import publish_artifact
from ckptflow.fsutil import walk_files
from ckptflow.jsonio import validate
from ckptflow.records import manifest as manifest_record
from ckptflow.records import staging as staging_record
from ckptflow.store.base import DEFAULT_CONCURRENCY
from ckptflow.store.transfer import DEFAULT_RANGE_SIZE
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact
from helpers.cli import run_cli, start_cli, wait_for_file
from helpers.trees import tree_bytes

MiB = 1024 * 1024
PAYLOADS = ["model.pt", "optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp", "optim/__2_0.distcp"]


def fetch_args(store, creds, dst):
    return ("fetch", "--artifact-uri", f"s3://{store.bucket}/{ARTIFACT_PREFIX}", "--dst", str(dst), "--credentials", str(creds))


def staged_payloads(staged):
    return sorted(p for p in walk_files(staged) if p in PAYLOADS)


def parts(staged):
    return sorted(p for p in walk_files(staged) if p.endswith(".part"))


def assert_identical(artifact, staged):
    for rel in [*PAYLOADS, manifest_record.FILENAME]:
        assert (staged / rel).read_bytes() == (artifact / rel).read_bytes(), rel


@pytest.mark.slow
def test_fetch_killed_after_a_file_reruns_without_downloading_verified_files(
        artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    args = fetch_args(sw_store, seaweedfs_credentials_path, tmp_path / "stage")
    killed = run_cli(*args, env={"CKPTFLOW_TEST_KILL_AT": "fetch:after-file:optim/__1_0.distcp"})
    assert killed.returncode == -signal.SIGKILL
    staged = tmp_path / "stage" / "iter_000300"
    verified = staged_payloads(staged)
    assert "optim/__1_0.distcp" in verified
    assert not staging_record.read_staging(staged).complete

    counting = CountingStore(sw_store)
    result = fetch_artifact(f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", tmp_path / "stage", store=counting, progress=False)
    assert result.status == "resumed" and result.reused == verified
    # Verified files cross the wire no more. Files after the kill point may already sit complete in
    # their parts (the stream runs ahead of the renames): those resume from their re-hashed parts.
    resumed_at = {r["path"]: r["offset"] for r in result.resumed}
    for rel in PAYLOADS:
        size = (artifact / rel).stat().st_size
        expected = [] if rel in verified or resumed_at.get(rel) == size else [(resumed_at.get(rel, 0), size)]
        assert counting.spans(f"/{rel}") == expected, rel
    assert result.downloaded_bytes == counting.downloaded_bytes()
    assert_identical(artifact, staged)
    assert parts(staged) == [] and staging_record.read_staging(staged).complete


# More ranges than a fetch holds in flight or waiting (2 x concurrency): when the kill lands after the
# first range, the last ones have not been requested, so the part always stops short of the end.
BIG_MODEL = (2 * DEFAULT_CONCURRENCY + 1) * DEFAULT_RANGE_SIZE


@pytest.fixture
def big_artifact(tmp_path, sw_store):
    """model.pt spans more ranges than are ever in flight, so a kill always lands inside it."""
    art = make_artifact(tmp_path / "run-big", model_bytes=BIG_MODEL)
    publish_artifact(art, sw_store, UPLOAD_PREFIX, progress=False)
    return art


def kill_mid_model(sw_store, creds, tmp_path):
    killed = run_cli(*fetch_args(sw_store, creds, tmp_path / "stage"), env={"CKPTFLOW_TEST_KILL_AT": "fetch:mid-file:model.pt"})
    assert killed.returncode == -signal.SIGKILL
    staged = tmp_path / "stage" / "iter_000300"
    [part] = [p for p in parts(staged) if p.startswith(".model.pt.")]
    assert not (staged / "model.pt").exists()
    return staged, staged / part


@pytest.mark.slow
def test_fetch_killed_mid_file_resumes_the_part_from_its_reverified_prefix(
        big_artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    staged, part = kill_mid_model(sw_store, seaweedfs_credentials_path, tmp_path)
    assert part.stat().st_size >= DEFAULT_RANGE_SIZE

    counting = CountingStore(sw_store)
    result = fetch_artifact(f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", tmp_path / "stage", store=counting, progress=False)
    [resumed] = [r for r in result.resumed if r["path"] == "model.pt"]  # small parts may be whole
    # the other ranges were in flight when it died: some, all or none of them may be on disk
    assert resumed["path"] == "model.pt" and DEFAULT_RANGE_SIZE <= resumed["offset"] < BIG_MODEL
    assert counting.spans("/model.pt") == [(resumed["offset"], BIG_MODEL)]  # only the remainder crossed the wire
    assert result.downloaded_bytes == counting.downloaded_bytes()
    assert_identical(big_artifact, staged)
    assert parts(staged) == [] and staging_record.read_staging(staged).complete


@pytest.mark.slow
def test_a_resumed_part_whose_prefix_is_wrong_is_downloaded_whole(big_artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    staged, part = kill_mid_model(sw_store, seaweedfs_credentials_path, tmp_path)
    with open(part, "r+b") as fh:  # damage the prefix the resume would reuse
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))

    counting = CountingStore(sw_store)
    result = fetch_artifact(f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", tmp_path / "stage", store=counting, progress=False)
    # the remainder after the damaged prefix, then (the whole file failing its digest) all of it again
    resumed_at = next(r["offset"] for r in result.resumed if r["path"] == "model.pt")
    assert counting.whole_calls == [(f"{ARTIFACT_PREFIX}/model.pt", 0, BIG_MODEL)]
    model_bytes = sum(end - start for key, start, end in counting.downloads if key.endswith("/model.pt"))
    assert model_bytes == (BIG_MODEL - resumed_at) + BIG_MODEL
    assert result.downloaded_bytes == counting.downloaded_bytes()
    assert_identical(big_artifact, staged)
    assert parts(staged) == []


@pytest.mark.slow
def test_fetch_killed_before_completion_reruns_with_nothing_to_download(
        artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    args = fetch_args(sw_store, seaweedfs_credentials_path, tmp_path / "stage")
    killed = run_cli(*args, env={"CKPTFLOW_TEST_KILL_AT": "fetch:before-complete"})
    assert killed.returncode == -signal.SIGKILL
    staged = tmp_path / "stage" / "iter_000300"
    assert not staging_record.read_staging(staged).complete  # a missing commit means incomplete, never done
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.report["status"] == "resumed" and rerun.report["downloaded_bytes"] == 0
    assert rerun.report["reused"] == PAYLOADS
    assert staging_record.read_staging(staged).complete


@pytest.mark.slow
def test_two_fetchers_into_one_stage_both_succeed(artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    flag = tmp_path / "paused"
    args = fetch_args(sw_store, seaweedfs_credentials_path, tmp_path / "stage")
    first = start_cli(*args, env={"CKPTFLOW_TEST_PAUSE_AT": "fetch:after-record", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    wait_for_file(flag, first)
    second = run_cli(*args)
    flag.unlink()
    out, err = first.communicate(timeout=120)
    assert second.returncode == 0, second.stderr
    assert first.returncode == 0, err
    assert json.loads(out)["status"] == "fetched" and second.report["status"] == "resumed"
    staged = tmp_path / "stage" / "iter_000300"
    assert_identical(artifact, staged)
    assert parts(staged) == [] and staging_record.read_staging(staged).complete


def test_cli_fetch_report_matches_its_schema_with_progress_on_stderr(artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    proc = run_cli(*fetch_args(sw_store, seaweedfs_credentials_path, tmp_path / "stage"), env={"CKPTFLOW_PROGRESS": "1"})
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_fetch", what="fetch report")
    assert proc.report["path"] == str(tmp_path / "stage" / "iter_000300")
    assert proc.report["status"] == "fetched"
    assert "fetch" in proc.stderr  # the byte bar went to stderr, stdout holds the one report
    again = run_cli(*fetch_args(sw_store, seaweedfs_credentials_path, tmp_path / "stage"))
    assert again.returncode == 0 and again.report["status"] == "already-staged"
    validate(again.report, "report_fetch", what="fetch report")
    assert "ckptflow-test-secret" not in proc.stdout + proc.stderr + again.stdout + again.stderr


def test_cli_fetch_refusals_are_one_line_and_exit_1(artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    foreign = tmp_path / "stage" / "iter_000300"
    foreign.mkdir(parents=True)
    (foreign / "model.pt").write_bytes(b"not ours")
    before = tree_bytes(tmp_path / "stage")
    proc = run_cli(*fetch_args(sw_store, seaweedfs_credentials_path, tmp_path / "stage"))
    assert proc.returncode == 1 and proc.report["status"] == "refused"
    validate(proc.report, "report_error", what="error report")
    assert str(foreign) in proc.stderr and proc.stderr.count("\n") == 1
    assert tree_bytes(tmp_path / "stage") == before

    usage = run_cli("fetch", "--artifact-uri", f"s3://{sw_store.bucket}/proj", "--dst", str(tmp_path / "x"),
                    "--credentials", str(seaweedfs_credentials_path))
    assert usage.returncode == 2 and usage.report["status"] == "usage-error"
