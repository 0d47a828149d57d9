"""fetch onto a small disk: refused by name before the first byte, and a disk another writer fills
during the download named (file, bytes, remedy), verified files kept, the rerun completing.

The disks are real tmpfs mounts (``helpers.disks``: root only; skipped with the reason where mounting
is impossible, failed instead when ``CI`` is set).
"""

from __future__ import annotations

import json
import os
import shutil
import signal

import pytest
from archive_helpers import CountingStore

from ckptflow.archive import space
from ckptflow.archive.fetch import fetch_artifact
from ckptflow.archive.publish import publish_artifact
from ckptflow.errors import InsufficientSpace, OutOfSpace, Refused
from ckptflow.fsutil import walk_files
from ckptflow.jsonio import validate
from ckptflow.records import manifest as manifest_record
from ckptflow.records import staging as staging_record
from ckptflow.store.credentials import load_credentials
from ckptflow.store.s3 import S3Store
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact, publish_without_part_digests
from helpers.cli import run_cli, start_cli, wait_for_file
from helpers.disks import fill, tmpfs_mounts
from helpers.paused import resume, start_paused

MiB = 1024 * 1024
PAYLOADS = ["model.pt", "optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp", "optim/__2_0.distcp"]
STAGED = "stage/iter_000300"


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(nbytes)``: a fresh tmpfs of that size, unmounted after the test."""
    with tmpfs_mounts(tmp_path) as mount:
        yield mount


def s3_uri(store) -> str:
    return f"s3://{store.bucket}/{ARTIFACT_PREFIX}"


def fetch_args(store, creds, dst):
    return ("fetch", "--artifact-uri", s3_uri(store), "--dst", str(dst), "--credentials", str(creds))


def published(tmp_path, store, model_bytes):
    art = make_artifact(tmp_path / "run", model_bytes=model_bytes)
    publish_artifact(art, store, UPLOAD_PREFIX, progress=False)
    return art


def artifact_bytes(art) -> int:
    return sum((art / p).stat().st_size for p in [*PAYLOADS, manifest_record.FILENAME])


def assert_identical(art, staged):
    for rel in [*PAYLOADS, manifest_record.FILENAME]:
        assert (staged / rel).read_bytes() == (art / rel).read_bytes(), rel


def parts(root):
    return [p for p in walk_files(root) if p.endswith(".part")]


def test_an_artifact_larger_than_the_disk_is_refused_by_name_before_the_first_byte(
        tmp_path, sw_store, seaweedfs_credentials_path, small_disk):
    art = published(tmp_path, sw_store, 6 * MiB)
    disk = small_disk(4 * MiB)
    free = shutil.disk_usage(disk).free

    proc = run_cli(*fetch_args(sw_store, seaweedfs_credentials_path, disk / "stage"))
    assert proc.returncode == 1 and proc.report["status"] == "refused", proc.stderr
    validate(proc.report, "report_error", what="error report")
    err = proc.report["error"]
    staged = disk / STAGED
    assert err["type"] == "InsufficientSpace" and err["path"] == str(staged)
    assert err["free_bytes"] == free and err["needed_bytes"] >= artifact_bytes(art) > free
    message = err["message"]
    for named in (str(staged), f"{free} bytes", f"{err['needed_bytes']} bytes",
                  f"free at least {err['needed_bytes'] - free} bytes", "nothing was written"):
        assert named in message, named
    assert proc.stderr.count("\n") == 1 and message in proc.stderr
    assert os.listdir(disk) == []  # not even the stage directory

    counting = CountingStore(sw_store)
    with pytest.raises(InsufficientSpace) as caught:
        fetch_artifact(s3_uri(sw_store), disk / "stage", store=counting, progress=False)
    assert isinstance(caught.value, Refused) and caught.value.errno == 28  # ENOSPC for stdlib callers
    assert counting.downloads == [] and os.listdir(disk) == []


def test_with_the_check_switched_off_the_full_disk_still_fails_by_name_and_keeps_nothing_half_done(
        tmp_path, sw_store, small_disk, monkeypatch):
    art = published(tmp_path, sw_store, 6 * MiB)
    disk = small_disk(4 * MiB)
    monkeypatch.setenv("CKPTFLOW_SPACE_CHECK", "0")  # for a file system whose free space is understated
    with pytest.raises(OutOfSpace) as caught:
        fetch_artifact(s3_uri(sw_store), disk / "stage", store=sw_store, progress=False)
    staged = disk / STAGED
    assert not isinstance(caught.value, Refused)
    assert caught.value.path in {str(staged / p) for p in PAYLOADS} and caught.value.path in str(caught.value)
    assert not staging_record.read_staging(staged).complete
    for rel in PAYLOADS:  # whatever is in place was verified
        assert not (staged / rel).exists() or (staged / rel).read_bytes() == (art / rel).read_bytes()


@pytest.mark.slow
def test_the_check_counts_only_files_not_yet_verified_so_a_resume_fits(
        tmp_path, sw_store, seaweedfs_credentials_path, small_disk):
    art = published(tmp_path, sw_store, 6 * MiB)
    disk = small_disk(10 * MiB)
    args = fetch_args(sw_store, seaweedfs_credentials_path, disk / "stage")
    killed = run_cli(*args, env={"CKPTFLOW_TEST_KILL_AT": "fetch:after-file:model.pt"})
    assert killed.returncode == -signal.SIGKILL
    staged = disk / STAGED
    assert (staged / "model.pt").read_bytes() == (art / "model.pt").read_bytes()

    fill(disk, leave=MiB)  # far less than the artifact, more than what is left of it
    assert shutil.disk_usage(disk).free < artifact_bytes(art)
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.report["status"] == "resumed" and "model.pt" in rerun.report["reused"]
    assert_identical(art, staged)
    assert parts(staged) == [] and staging_record.read_staging(staged).complete


def test_replacing_an_own_copy_counts_the_space_its_removal_frees(tmp_path, sw_store, small_disk):
    published(tmp_path, sw_store, 5 * MiB)
    other = make_artifact(tmp_path / "run2", model_bytes=5 * MiB, seed=7)
    publish_artifact(other, sw_store, "proj/group/run2/20261129T000000Z/checkpoints", progress=False)
    disk = small_disk(8 * MiB)  # one copy fits, two side by side do not
    first = fetch_artifact(s3_uri(sw_store), disk / "stage", store=sw_store, progress=False)
    assert shutil.disk_usage(disk).free < artifact_bytes(other)

    other_uri = f"s3://{sw_store.bucket}/proj/group/run2/20261129T000000Z/checkpoint_artifacts/iter_000300"
    result = fetch_artifact(other_uri, disk / "stage", store=sw_store, progress=False)
    assert result.status == "replaced" and result.path == first.path
    assert_identical(other, result.path)


def serial_store(bucket, creds_path):
    """One 1 MiB range at a time, largest file first: model.pt is written in order before any shard."""
    return S3Store(bucket, load_credentials(creds_path), download_concurrency=1, download_range_size=MiB)


def fetch_filled_meanwhile(store, disk, leave, tmp_path, monkeypatch):
    """Fetch in a thread paused after its free-space check; another writer leaves ``leave`` bytes free
    meanwhile. Returns what the fetch raised and the other writer's file."""
    flag = tmp_path / "paused"
    worker, outcome = start_paused(
        lambda: fetch_artifact(s3_uri(store), disk / "stage", store=store, progress=False),
        "fetch:after-record", flag, monkeypatch)
    filler = fill(disk, leave=leave)
    resume(worker, flag, monkeypatch)
    return outcome.get("error", outcome), filler


def test_a_disk_filled_during_the_download_names_the_file_keeps_verified_files_and_the_rerun_completes(
        tmp_path, sw_store, seaweedfs_bucket, seaweedfs_credentials_path, small_disk, monkeypatch):
    art = published(tmp_path, sw_store, 3 * MiB)
    disk = small_disk(8 * MiB)
    store = serial_store(seaweedfs_bucket, seaweedfs_credentials_path)
    # room for model.pt, not for the first shard after it
    err, filler = fetch_filled_meanwhile(store, disk, 3 * MiB + 8 * 1024, tmp_path, monkeypatch)

    staged = disk / STAGED
    assert isinstance(err, OutOfSpace) and not isinstance(err, Refused), err
    assert err.errno == 28 and err.path == str(staged / "optim/__2_0.distcp")
    message = str(err)
    for named in (str(staged / "optim/__2_0.distcp"), "filled up", "another process", f"{space.size_text(err.free)} free now",
                  "1 file(s) verified by this run are in place", "free at least", "rerun the same command"):
        assert named in message, named
    assert err.needed > err.free
    assert (staged / "model.pt").read_bytes() == (art / "model.pt").read_bytes()  # verified, kept
    assert parts(staged) == []  # the cut shard holds no prefix a rerun could resume from: removed
    assert not staging_record.read_staging(staged).complete

    filler.unlink()
    counting = CountingStore(sw_store)
    result = fetch_artifact(s3_uri(sw_store), disk / "stage", store=counting, progress=False)
    assert result.status == "resumed" and result.reused == ["model.pt"]
    assert counting.spans("/model.pt") == []  # the kept file did not cross the wire again
    assert_identical(art, staged)
    assert parts(staged) == [] and staging_record.read_staging(staged).complete


def test_a_file_cut_by_a_full_disk_resumes_from_its_part_which_the_check_counts_as_written(
        tmp_path, sw_store, seaweedfs_bucket, seaweedfs_credentials_path, small_disk, monkeypatch):
    # An archive without part digests: its part resumes from any verified prefix (one with them resumes
    # after whole 8 MiB parts, larger than this disk).
    art = make_artifact(tmp_path / "run", model_bytes=3 * MiB)
    publish_without_part_digests(art, sw_store)
    disk = small_disk(8 * MiB)
    store = serial_store(seaweedfs_bucket, seaweedfs_credentials_path)
    err, filler = fetch_filled_meanwhile(store, disk, 3 * MiB // 2, tmp_path, monkeypatch)  # half of model.pt fits
    staged = disk / STAGED
    assert isinstance(err, OutOfSpace) and err.path == str(staged / "model.pt"), err
    assert "0 file(s) verified by this run are in place" in str(err)
    [part] = parts(staged)
    assert part.startswith(".model.pt.") and not (staged / "model.pt").exists()

    # Free less than the artifact needs from scratch, but more than what its part leaves to write.
    with open(filler, "r+b") as fh:
        fh.truncate(os.fstat(fh.fileno()).st_size - 9 * MiB // 4)
    assert 2 * MiB < shutil.disk_usage(disk).free < 3 * MiB  # less than model.pt alone
    counting = CountingStore(sw_store)
    result = fetch_artifact(s3_uri(sw_store), disk / "stage", store=counting, progress=False)
    assert result.status == "resumed" and result.resumed == [{"path": "model.pt", "offset": MiB}]
    assert counting.spans("/model.pt") == [(MiB, 3 * MiB)]  # the part's verified prefix stayed
    assert_identical(art, staged)
    assert parts(staged) == [] and staging_record.read_staging(staged).complete


@pytest.mark.slow
def test_cli_fetch_onto_a_disk_filled_meanwhile_fails_by_name_and_the_rerun_resumes(
        tmp_path, sw_store, seaweedfs_credentials_path, small_disk):
    art = published(tmp_path, sw_store, 6 * MiB)
    disk = small_disk(10 * MiB)
    args = fetch_args(sw_store, seaweedfs_credentials_path, disk / "stage")
    flag = tmp_path / "paused"
    proc = start_cli(*args, env={"CKPTFLOW_TEST_PAUSE_AT": "fetch:after-record", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    wait_for_file(flag, proc)
    filler = fill(disk, leave=2 * MiB)
    flag.unlink()
    out, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    report = validate_error(out)
    err = report["error"]
    staged = disk / STAGED
    assert report["status"] == "failed" and err["type"] == "OutOfSpace"
    assert err["path"] in {str(staged / p) for p in PAYLOADS}
    assert err["path"] in stderr and "free at least" in stderr and stderr.count("\n") == 1
    assert err["needed_bytes"] > err["free_bytes"]
    assert "No space left on device" in stderr  # the system's words, after ckptflow's

    filler.unlink()
    rerun = run_cli(*args)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.report["status"] == "resumed"
    assert_identical(art, staged)
    assert parts(staged) == [] and staging_record.read_staging(staged).complete


def validate_error(stdout: str) -> dict:
    report = json.loads(stdout)
    validate(report, "report_error", what="error report")
    return report


def test_the_disk_helper_skips_with_its_reason_but_fails_when_ci_is_set(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv("CI", "1")
    with tmpfs_mounts(tmp_path / "ci") as mount, pytest.raises(pytest.fail.Exception, match="CI is set"):
        mount(MiB)
    monkeypatch.delenv("CI")
    with tmpfs_mounts(tmp_path / "local") as mount, pytest.raises(pytest.skip.Exception, match="needs root"):
        mount(MiB)
