"""Real `ckptflow fetch` processes: SIGKILLed mid-way and rerun, raced, and the CLI contract."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time

import pytest
from archive_helpers import CountingStore

from ckptflow.archive.fetch import fetch_artifact
from ckptflow.archive.publish import publish_artifact
from ckptflow.archive.stage import stage_lock
from ckptflow.fsutil import walk_files
from ckptflow.jsonio import validate
from ckptflow.records import manifest as manifest_record
from ckptflow.records import staging as staging_record
from ckptflow.store.base import DEFAULT_CONCURRENCY
from ckptflow.store.open import open_bucket_arg
from ckptflow.store.transfer import DEFAULT_RANGE_SIZE
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact, publish_without_part_digests
from helpers.cli import run_cli, start_cli, take_turns_at_a_lock, wait_for_file
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


@pytest.fixture
def big_artifact_without_part_digests(tmp_path, sw_store):
    """``big_artifact`` archived as a ckptflow without part digests did: verified by whole-file SHA-256."""
    art = make_artifact(tmp_path / "run-big", model_bytes=BIG_MODEL)
    publish_without_part_digests(art, sw_store)
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


def damage(part, offset):
    with open(part, "r+b") as fh:  # damage the prefix the resume would reuse
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


@pytest.mark.slow
def test_a_resumed_part_is_checked_part_by_part_and_resumes_before_the_first_that_fails(
        big_artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    staged, part = kill_mid_model(sw_store, seaweedfs_credentials_path, tmp_path)
    damage(part, DEFAULT_RANGE_SIZE + 1000)  # in the second 8 MiB part: the first one still checks

    counting = CountingStore(sw_store)
    result = fetch_artifact(f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", tmp_path / "stage", store=counting, progress=False)
    # the first part checks and is kept; everything from the damaged part on crosses the wire once
    assert [r for r in result.resumed if r["path"] == "model.pt"] == [{"path": "model.pt", "offset": DEFAULT_RANGE_SIZE}]
    assert counting.whole_calls == []
    assert counting.spans("/model.pt") == [(DEFAULT_RANGE_SIZE, BIG_MODEL)]
    assert result.downloaded_bytes == counting.downloaded_bytes()
    assert_identical(big_artifact, staged)
    assert parts(staged) == []


@pytest.mark.slow
def test_a_resumed_part_whose_prefix_is_wrong_is_downloaded_whole(
        big_artifact_without_part_digests, sw_store, seaweedfs_credentials_path, tmp_path):
    big_artifact = big_artifact_without_part_digests
    staged, part = kill_mid_model(sw_store, seaweedfs_credentials_path, tmp_path)
    damage(part, 1000)

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
    args = fetch_args(sw_store, seaweedfs_credentials_path, tmp_path / "stage")
    # The second waits for the stage's lock, naming its holder, then finds the first one's finished copy.
    first, out, err, second, out2, err2 = take_turns_at_a_lock(args, "fetch:after-record", "fetch:lock-wait", tmp_path)
    assert first.returncode == 0, err
    assert second.returncode == 0, err2
    assert json.loads(out)["status"] == "fetched"
    assert json.loads(out2)["status"] == "already-staged" and json.loads(out2)["downloaded_bytes"] == 0
    staged = tmp_path / "stage" / "iter_000300"
    assert_identical(artifact, staged)
    assert parts(staged) == [] and staging_record.read_staging(staged).complete


def paused_or_done(flag, proc, timeout: float = 120) -> bool:
    """Wait until ``proc`` pauses at a point (True) or exits (False)."""
    deadline = time.monotonic() + timeout
    while not flag.exists():
        if proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, "the process neither paused nor exited"
        time.sleep(0.05)
    return True


def assert_record_truthful(staged):
    """A complete ``.staged.json`` never names a file that is not in place with its size."""
    record = staging_record.read_staging(staged)
    if record.complete:
        missing = [e.path for e in record.files if not (staged / e.path).is_file()
                   or (staged / e.path).stat().st_size != e.size]
        assert missing == [], f"{staging_record.FILENAME} says complete while {missing} are not in place"


@pytest.mark.slow
@pytest.mark.parametrize("lock", ["held", "ineffective"])
def test_a_fetch_racing_another_into_a_partial_stage_never_removes_its_verified_files(
        lock, artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    """After a killed fetch, A plans; B completes the stage; A goes on. With the stage's lock B waits for A;
    where flock does nothing (the guard switched off) A's removals re-check each file and keep B's."""
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    args = fetch_args(sw_store, seaweedfs_credentials_path, tmp_path / "stage")
    env = {} if lock == "held" else {"CKPTFLOW_TEST_DISABLE": "fetch:lock"}
    killed = run_cli(*args, env={**env, "CKPTFLOW_TEST_KILL_AT": "fetch:after-record"})
    assert killed.returncode == -signal.SIGKILL
    staged = tmp_path / "stage" / "iter_000300"
    flag_a, flag_b = tmp_path / "a-paused", tmp_path / "b-paused"
    a = start_cli(*args, env={**env, "CKPTFLOW_TEST_PAUSE_AT": "fetch:after-record,fetch:after-file:model.pt",
                              "CKPTFLOW_TEST_PAUSE_FILE": str(flag_a)})
    wait_for_file(flag_a, a)
    b = start_cli(*args, env={**env, "CKPTFLOW_TEST_PAUSE_AT": "fetch:lock-wait", "CKPTFLOW_TEST_PAUSE_FILE": str(flag_b)})
    b_waits = paused_or_done(flag_b, b)
    if b_waits:
        flag_b.unlink()  # B goes on waiting for the lock A holds
    else:  # B completed the stage while A was paused: its verified files must survive A
        assert b.wait(timeout=120) == 0
        assert_record_truthful(staged)
        b_files = {rel: (staged / rel).stat().st_ino for rel in PAYLOADS}
    flag_a.unlink()
    if paused_or_done(flag_a, a):  # A stopped again once its model.pt is in place
        assert_record_truthful(staged)
        flag_a.unlink()
    out_a, err_a = a.communicate(timeout=120)
    out_b, err_b = b.communicate(timeout=120)
    assert a.returncode == 0, err_a
    assert b.returncode == 0, err_b
    if not b_waits:
        assert {rel: (staged / rel).stat().st_ino for rel in PAYLOADS} == b_files, "A removed B's verified files"
    assert "does not match the archive" not in err_a + err_b
    assert b_waits == (lock == "held")
    assert_identical(artifact, staged)
    assert parts(staged) == [] and staging_record.read_staging(staged).complete
    report_a, report_b = json.loads(out_a), json.loads(out_b)
    if lock == "held":
        assert report_a["status"] == "resumed" and report_a["downloaded"] == PAYLOADS
        assert report_b["status"] == "already-staged" and report_b["downloaded_bytes"] == 0
    else:  # B completed the stage first; A hashed what appeared meanwhile and kept it
        assert report_b["status"] == "resumed" and report_b["downloaded"] == PAYLOADS
        assert report_a["status"] == "resumed" and report_a["downloaded_bytes"] == 0
        assert report_a["reused"] == PAYLOADS


@pytest.mark.slow
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


def test_a_fetch_refuses_by_its_holders_name_when_the_stage_stays_locked(artifact, sw_store, seaweedfs_credentials_path,
                                                                         tmp_path):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    staged = tmp_path / "stage" / "iter_000300"
    with stage_lock(staged, 0):
        proc = run_cli(*fetch_args(sw_store, seaweedfs_credentials_path, tmp_path / "stage"),
                       "--lock-wait-seconds", "0.5")
    assert proc.returncode == 1 and proc.report["status"] == "refused", proc.stderr
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in proc.stderr and "--lock-wait-seconds" in proc.stderr
    assert str(staged) in proc.stderr and proc.stderr.count("\n") == 1
    assert not staged.exists()  # nothing was written


def test_a_stage_a_killed_fetch_left_from_one_copy_is_completed_from_another_copy_of_the_same_archive(
        artifact, tmp_path):
    """Two copies of one archive (the same declaration: ``publish --add-destination``) at two ``file://`` roots:
    a fetch from A killed after a file leaves its claimed stage; the fetch from B resumes it (the verified files
    re-hashed and kept, the rest downloaded) instead of replacing it, and the record then names B."""
    roots = {name: tmp_path / name for name in ("A", "B")}
    roots["A"].mkdir()
    publish_artifact(artifact, open_bucket_arg(f"file://{roots['A']}", None), UPLOAD_PREFIX, progress=False)
    shutil.copytree(roots["A"], roots["B"])
    uris = {name: f"file://{root}/{ARTIFACT_PREFIX}" for name, root in roots.items()}
    killed = run_cli("fetch", "--artifact-uri", uris["A"], "--dst", str(tmp_path / "stage"),
                     env={"CKPTFLOW_TEST_KILL_AT": "fetch:after-file:optim/__1_0.distcp"})
    assert killed.returncode == -signal.SIGKILL
    staged = tmp_path / "stage" / "iter_000300"
    verified = staged_payloads(staged)
    claim = staging_record.read_staging(staged)
    assert "optim/__1_0.distcp" in verified and not claim.complete and claim.source_uri == uris["A"]

    result = fetch_artifact(uris["B"], tmp_path / "stage", progress=False)
    assert result.status == "resumed" and result.removed == [], result.to_report()
    assert result.reused == verified and not set(result.downloaded) & set(verified)
    record = staging_record.read_staging(staged)
    assert record.complete and record.source_uri == uris["B"] and record.declaration_sha256 == claim.declaration_sha256
    assert_identical(artifact, staged)
