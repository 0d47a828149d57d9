"""preflight: the upload destination is checked before training (prefix, credentials, bucket, create-once),
and refused in one line naming the problem and the remedy; an unreachable endpoint is a warning unless strict."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from trainer_helpers import tiny_training

from ckptflow.errors import PreflightFailed
from ckptflow.records import probe as probe_record
from ckptflow.store.credentials import load_credentials
from ckptflow.store.open import CHECK_BOUNDS, open_bucket_arg
from ckptflow.store.s3 import S3Store
from ckptflow.trainer import (
    UploadSettings,
    artifact_dir_for,
    preflight,
    save_and_publish,
    wait_for_publications,
)
from helpers import REPO, preloaded

preflight_module = importlib.import_module("ckptflow.trainer.preflight")  # the package exports the function by that name

RUN = "proj/grp/run1/20261201T000000Z"
PREFIX = f"{RUN}/checkpoints"


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A probe cache of the test's own: a record cached by another test never answers for this one."""
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path / "runs" / RUN


def one_line(exc: pytest.ExceptionInfo) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_preflight_passes_for_a_file_archive_and_leaves_it_empty(tmp_path, run_dir):
    (tmp_path / "store").mkdir()
    upload = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'store'}")
    result = preflight(run_dir, upload)
    assert result.checked and result.prefix == PREFIX and result.probed and result.warning is None
    assert result.destination == f"file://{tmp_path / 'store'}"
    assert not any(p.is_file() for p in (tmp_path / "store").rglob("*"))  # the probe's scratch files are gone
    assert not preflight(run_dir, upload).probed  # the cached probe record answers next time


def test_preflight_refuses_a_missing_file_archive_root(tmp_path, run_dir):
    upload = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'stroe'}")
    with pytest.raises(PreflightFailed) as exc:
        preflight(run_dir, upload)
    assert str(tmp_path / "stroe") in one_line(exc) and "training does not start" in str(exc.value)
    assert not (tmp_path / "stroe").exists()


def test_preflight_refuses_a_prefix_of_another_run_naming_the_derived_one(tmp_path, run_dir):
    (tmp_path / "store").mkdir()
    wrong = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'store'}",
                           prefix="proj/grp/run1/20261130T000000Z/checkpoints")
    with pytest.raises(PreflightFailed) as exc:
        preflight(run_dir, wrong)
    assert f"pass --upload-prefix {PREFIX}" in one_line(exc)
    outside = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'store'}")
    with pytest.raises(PreflightFailed, match="no upload prefix can be derived"):
        preflight(tmp_path / "loose-run", outside)
    assert list((tmp_path / "store").iterdir()) == []  # refused before the store was touched


def test_preflight_refuses_a_typod_bucket_on_seaweedfs(run_dir, seaweedfs_bucket, seaweedfs_credentials_path):
    upload = UploadSettings(enabled=True, bucket=seaweedfs_bucket + "-typo", credentials=str(seaweedfs_credentials_path))
    with pytest.raises(PreflightFailed) as exc:
        preflight(run_dir, upload)
    line = one_line(exc)
    assert f"bucket '{seaweedfs_bucket}-typo' does not exist at 127.0.0.1:18333" in line
    assert line.endswith("create the bucket first, or pass the right --bucket")


def test_preflight_refuses_credentials_the_endpoint_rejects(tmp_path, run_dir, seaweedfs_bucket,
                                                              seaweedfs_credentials_path):
    good = json.loads(seaweedfs_credentials_path.read_text())
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({**good, "aws_secret_access_key": "not-the-secret"}))
    # A passing probe record is cached for the endpoint: the credentials are still checked.
    assert preflight(run_dir, UploadSettings(enabled=True, bucket=seaweedfs_bucket,
                                             credentials=str(seaweedfs_credentials_path))).checked
    upload = UploadSettings(enabled=True, bucket=seaweedfs_bucket, credentials=str(creds))
    with pytest.raises(PreflightFailed) as exc:
        preflight(run_dir, upload)
    line = one_line(exc)
    assert f"s3://{seaweedfs_bucket}/{PREFIX} at 127.0.0.1:18333" in line and "403" in line
    assert "check the keys in the credentials file" in line
    assert "not-the-secret" not in line and good["aws_secret_access_key"] not in line
    missing = UploadSettings(enabled=True, bucket=seaweedfs_bucket, credentials=str(tmp_path / "nope.json"))
    with pytest.raises(PreflightFailed, match=r"nope\.json"):
        preflight(run_dir, missing)


def test_preflight_without_any_credentials_names_the_sources_tried(tmp_path, run_dir, monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                "CKPTFLOW_CREDENTIALS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(PreflightFailed) as exc:
        preflight(run_dir, UploadSettings(enabled=True, bucket="my-bucket"))
    line = one_line(exc)
    assert "no credentials found" in line and "CKPTFLOW_CREDENTIALS" in line


def test_preflight_refuses_an_endpoint_that_does_not_enforce_create_once(run_dir, s3rver_bucket,
                                                                           s3rver_credentials_path, cache):
    upload = UploadSettings(enabled=True, bucket=s3rver_bucket, credentials=str(s3rver_credentials_path))
    with pytest.raises(PreflightFailed) as exc:
        preflight(run_dir, upload)
    line = one_line(exc)
    assert "127.0.0.1:18334" in line and "a second create-once write of the same key was accepted" in line
    assert "run `ckptflow probe`" in line
    store = S3Store(s3rver_bucket, load_credentials(s3rver_credentials_path))
    assert store.list(f"{PREFIX}/") == []  # the probe's scratch objects are removed
    record = probe_record.read_probe_record(store.destination)
    assert record is not None and not record.passed
    with pytest.raises(PreflightFailed, match="no passing probe record"):  # the cached failure answers
        preflight(run_dir, upload)


def test_preflight_passes_on_seaweedfs_and_probes_once(run_dir, seaweedfs_bucket, seaweedfs_credentials_path):
    upload = UploadSettings(enabled=True, bucket=seaweedfs_bucket, credentials=str(seaweedfs_credentials_path))
    first = preflight(run_dir, upload)
    assert first.checked and first.probed and first.prefix == PREFIX
    assert first.destination == f"s3://{seaweedfs_bucket} at 127.0.0.1:18333"
    assert not preflight(run_dir, upload).probed
    store = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path))
    assert store.list("") == []  # nothing left in the bucket


@pytest.mark.slow
def test_an_unreachable_endpoint_is_a_warning_at_start_and_an_error_when_strict(tmp_path, run_dir, caplog):
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"aws_access_key_id": "k", "aws_secret_access_key": "s",
                                 "endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"}))
    upload = UploadSettings(enabled=True, bucket="ckpts", credentials=str(creds))
    with caplog.at_level(logging.WARNING, logger="ckptflow"):
        result = preflight(run_dir, upload)
    assert not result.checked and result.prefix == PREFIX
    assert "cannot reach the endpoint" in result.warning and "127.0.0.1:9" in result.warning
    assert "training goes on" in caplog.text
    with pytest.raises(PreflightFailed) as exc:
        preflight(run_dir, UploadSettings(enabled=True, bucket="ckpts", credentials=str(creds), strict=True))
    line = one_line(exc)
    assert "cannot reach the endpoint" in line and "(strict preflight)" in line
    assert line.endswith("check endpoint_url in the credentials file and that the server is up")


@pytest.mark.slow
def test_the_first_save_checks_the_destination_and_keeps_the_artifact_when_refused(tmp_path, run_dir):
    model, _ = tiny_training()
    typo = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'stroe'}", preflight=True)
    with pytest.raises(PreflightFailed) as exc:
        save_and_publish(run_dir, 10, {"model": model}, typo)
    art = artifact_dir_for(run_dir, 10)
    assert f"{art} is committed and kept" in one_line(exc)
    assert (art / ".posttrain-checkpoint-artifact.json").exists() and wait_for_publications(run_dir) == []
    (tmp_path / "store").mkdir()
    good = UploadSettings(enabled=True, bucket=f"file://{tmp_path / 'store'}", preflight=True)
    save_and_publish(run_dir, 20, {"model": model}, good)
    save_and_publish(run_dir, 30, {"model": model}, good)
    outcomes = wait_for_publications(run_dir, timeout=120)
    assert all(o.ok for o in outcomes) and {"iter_000020", "iter_000030"} <= {o.artifact_dir.name for o in outcomes}
    assert len(list(probe_record.probe_cache_dir().iterdir())) == 1  # one probe, on the first save only


@pytest.mark.slow
def test_train_tiny_with_preflight_stops_before_step_one_on_a_typod_bucket(tmp_path, run_dir):
    (tmp_path / "store").mkdir()
    proc = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_tiny.py"), "--run-dir", str(run_dir), "--steps", "4",
         "--save-every", "2", "--bucket", f"file://{tmp_path / 'stroe'}", "--preflight", "on"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env={**os.environ, "CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 3, proc.stderr
    assert "step 1" not in proc.stdout and not (run_dir / "checkpoint_artifacts").exists()
    assert "train_tiny: upload destination" in proc.stderr and str(tmp_path / "stroe") in proc.stderr
    ok = subprocess.run(
        [sys.executable, str(REPO / "examples" / "train_tiny.py"), "--run-dir", str(run_dir), "--steps", "4",
         "--save-every", "2", "--bucket", f"file://{tmp_path / 'store'}", "--preflight", "strict"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env={**os.environ, "CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")})
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout.splitlines()[-1])["published"] == ["iter_000002", "iter_000004"]


RANKS_SCRIPT = """
import json, sys
import torch.distributed as dist
from ckptflow.store.local import LocalStore
from ckptflow.trainer import UploadSettings, preflight

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank != 0:
    def no_store(*args, **kwargs):
        raise AssertionError(f"rank {rank} opened a store")
    LocalStore.__init__ = no_store
out = {}
for name, bucket in (("good", sys.argv[2]), ("typo", sys.argv[3])):
    try:
        out[name] = {"prefix": preflight(sys.argv[1], UploadSettings(enabled=True, bucket=bucket)).prefix}
    except Exception as exc:
        out[name] = {"error": f"{type(exc).__name__}: {exc}"}
if rank == 0:  # a process that checks alone (collective=False) waits for no peer
    out["alone"] = preflight(sys.argv[1], UploadSettings(enabled=True, bucket=sys.argv[2]), collective=False).prefix
dist.barrier()
with open(f"{sys.argv[4]}.{rank}", "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_preflight_in_a_process_group_checks_on_rank_zero_and_every_rank_learns_the_outcome(tmp_path, run_dir):
    """torchrun, 2 ranks (gloo): rank 1 cannot open a store at all, yet both ranks pass for a good destination
    and both raise the same refusal for a missing one; rank 0 checking alone (collective=False) waits for no peer."""
    (tmp_path / "store").mkdir()
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    proc = preloaded.torchrun(
        ["--standalone", "--nproc-per-node", "2", str(script), str(run_dir),
         f"file://{tmp_path / 'store'}", f"file://{tmp_path / 'stroe'}", str(tmp_path / "out")],
        cwd=tmp_path, timeout=180,
        env={**os.environ, "CKPTFLOW_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    zero, one = (json.loads((tmp_path / f"out.{r}").read_text()) for r in (0, 1))
    assert zero.pop("alone") == PREFIX and zero == one
    assert zero["good"] == {"prefix": PREFIX}
    assert zero["typo"]["error"].startswith("PreflightFailed: upload destination of ")
    assert str(tmp_path / "stroe") in zero["typo"]["error"]


def test_preflight_takes_credentials_and_bucket_from_the_environment(tmp_path, run_dir, monkeypatch, seaweedfs_bucket,
                                                                     seaweedfs_credentials_path):
    monkeypatch.setenv("CKPTFLOW_BUCKET", seaweedfs_bucket)
    monkeypatch.setenv("CKPTFLOW_CREDENTIALS", str(seaweedfs_credentials_path))
    assert preflight(run_dir, UploadSettings(enabled=True)).checked
    monkeypatch.setenv("CKPTFLOW_CREDENTIALS", str(tmp_path / "gone.json"))
    with pytest.raises(PreflightFailed) as exc:
        preflight(run_dir, UploadSettings(enabled=True))
    assert str(tmp_path / "gone.json") in one_line(exc)


@contextlib.contextmanager
def silent_endpoint(tmp_path: Path):
    """A credentials file for a server on 127.0.0.1 that accepts every connection and never answers a byte;
    yields (credentials path, list of the connections it accepted)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):  # the listener shut down: the test is over
            while True:
                accepted.append(server.accept()[0])

    acceptor = threading.Thread(target=accept, name="silent-endpoint", daemon=True)
    acceptor.start()
    creds = tmp_path / "silent.json"
    creds.write_text(json.dumps({"aws_access_key_id": "k", "aws_secret_access_key": "s",
                                 "endpoint_url": f"http://127.0.0.1:{server.getsockname()[1]}",
                                 "region_name": "us-east-1"}))
    try:
        yield creds, accepted
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
        acceptor.join()
        server.close()
        for conn in accepted:
            conn.close()


def test_the_check_is_bounded_to_answer_within_30_seconds_whatever_the_endpoint_does(tmp_path):
    """Each request of the check: CHECK_BOUNDS.attempts tries, bounded in connecting and reading (botocore's
    defaults are 60 s each, and the store's 8 attempts); the whole check under a deadline below 30 s."""
    assert CHECK_BOUNDS.attempts <= 2 and CHECK_BOUNDS.connect_s <= 5 and CHECK_BOUNDS.read_s <= 5
    assert CHECK_BOUNDS.worst_case_s() <= preflight_module.CHECK_DEADLINE_S < 30
    store = S3Store("ckpts", load_credentials(_write_creds(tmp_path, "http://127.0.0.1:9")),
                    **CHECK_BOUNDS.s3_options())
    config = store._client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (CHECK_BOUNDS.connect_s, CHECK_BOUNDS.read_s)
    assert config.retries == {"mode": "standard", "total_max_attempts": CHECK_BOUNDS.attempts}


def _write_creds(tmp_path: Path, endpoint: str) -> Path:
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"aws_access_key_id": "k", "aws_secret_access_key": "s", "endpoint_url": endpoint,
                                 "region_name": "us-east-1"}))
    return creds


@pytest.mark.slow
def test_a_server_that_accepts_and_never_answers_is_a_warning_after_a_bounded_number_of_attempts(
        tmp_path, run_dir, caplog):
    with silent_endpoint(tmp_path) as (creds, accepted):
        upload = UploadSettings(enabled=True, bucket="ckpts", credentials=str(creds))
        with caplog.at_level(logging.WARNING, logger="ckptflow"):
            result = preflight(run_dir, upload)
        assert not result.checked and result.prefix == PREFIX
        assert "HeadBucket" in result.warning and "ReadTimeoutError" in result.warning
        assert "training goes on" in caplog.text
        assert 1 <= len(accepted) <= CHECK_BOUNDS.attempts  # one request (HeadBucket), tried a bounded number of times
        with pytest.raises(PreflightFailed) as exc:
            preflight(run_dir, UploadSettings(enabled=True, bucket="ckpts", credentials=str(creds), strict=True))
        assert "ReadTimeoutError" in one_line(exc) and "(strict preflight)" in str(exc.value)
        assert len(accepted) <= 2 * CHECK_BOUNDS.attempts


def test_a_check_still_running_at_its_deadline_is_answered_as_an_endpoint_that_did_not_answer(
        tmp_path, run_dir, monkeypatch):
    monkeypatch.setattr(preflight_module, "CHECK_DEADLINE_S", 0.2)  # the silent server's first read outlasts it
    with silent_endpoint(tmp_path) as (creds, _):
        result = preflight(run_dir, UploadSettings(enabled=True, bucket="ckpts", credentials=str(creds)))
        assert not result.checked and result.prefix == PREFIX
        assert "the endpoint did not complete the check within 0.2 s" in result.warning
        with pytest.raises(PreflightFailed) as exc:
            preflight(run_dir, UploadSettings(enabled=True, bucket="ckpts", credentials=str(creds), strict=True))
        line = one_line(exc)
        assert f"upload destination of {run_dir}: the endpoint did not complete the check" in line
        assert "(strict preflight); training does not start" in line


def test_the_store_of_a_check_bounds_its_requests_and_every_other_store_keeps_its_defaults(
        seaweedfs_bucket, seaweedfs_credentials_path):
    checked = open_bucket_arg(seaweedfs_bucket, str(seaweedfs_credentials_path), bounds=CHECK_BOUNDS)
    plain = open_bucket_arg(seaweedfs_bucket, str(seaweedfs_credentials_path))
    assert checked._client.meta.config.read_timeout == CHECK_BOUNDS.read_s
    assert plain._client.meta.config.read_timeout == 60 and plain._client.meta.config.connect_timeout == 60
    assert plain._client.meta.config.retries["total_max_attempts"] == 8


def test_uploads_are_checked_by_default_and_off_is_an_explicit_choice():
    assert UploadSettings(enabled=True, bucket="b").preflight
    assert not UploadSettings(enabled=True, bucket="b", preflight=False).preflight


@pytest.mark.slow
def test_a_typod_bucket_under_torchrun_with_the_example_defaults_exits_before_any_step(
        tmp_path, run_dir, seaweedfs_credentials_path):
    proc = preloaded.torchrun(
        ["--standalone", "--nproc-per-node", "2", str(REPO / "examples" / "train_tiny.py"),
         "--run-dir", str(run_dir), "--steps", "4", "--save-every", "2", "--bucket", "s3://typo",
         "--credentials", str(seaweedfs_credentials_path)],
        cwd=REPO, timeout=300,
        env={**os.environ, "CKPTFLOW_CACHE_DIR": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
             "CKPTFLOW_PROGRESS": "0"})
    assert proc.returncode != 0, proc.stdout + proc.stderr[-3000:]
    assert "step 1" not in proc.stdout and not (run_dir / "checkpoint_artifacts").exists()
    refusals = [line for line in proc.stderr.splitlines() if line.startswith("train_tiny: upload destination")]
    assert len(refusals) == 2, proc.stderr[-3000:]  # every rank, the same line
    assert refusals[0] == refusals[1] and "bucket 'typo' does not exist at 127.0.0.1:18333" in refusals[0]
