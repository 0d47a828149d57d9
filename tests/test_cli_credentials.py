"""Every report names where the command's credentials came from, never a key: the ``--credentials`` file,
the file ``$CKPTFLOW_CREDENTIALS`` names, or botocore's chain with its method; null when none were read.
With no source at all, the error lists the sources tried in order. Real CLI processes, real SeaweedFS."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ckptflow.jsonio import validate
from helpers import REPO
from helpers.artifacts import UPLOAD_PREFIX, make_artifact
from helpers.cli import run_cli, run_on_terminal

RUN_PREFIX = "proj/group/run1"


@pytest.fixture(autouse=True)
def no_ambient_credentials(tmp_path, monkeypatch):
    """Neither ckptflow's variables nor any source of botocore's chain: each test names its one source.
    (run_cli passes this process's environment on.)"""
    for var in ("CKPTFLOW_CREDENTIALS", "CKPTFLOW_BUCKET", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL",
                "AWS_ENDPOINT_URL_S3", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(tmp_path / "cache"))


def _keys(credentials_path: Path) -> dict:
    return json.loads(credentials_path.read_text(encoding="utf-8"))


def _no_key_shown(proc, credentials_path: Path) -> None:
    keys = _keys(credentials_path)
    for name in ("aws_secret_access_key", "aws_access_key_id"):
        assert keys[name] not in proc.stdout and keys[name] not in proc.stderr, name


def _gc_dry_run(bucket: str, *extra: str, env: dict | None = None):
    return run_cli("gc-uploads", "--bucket", bucket, "--prefix", RUN_PREFIX, "--dry-run", *extra, env=env)


def test_report_names_the_credentials_file_given_with_the_flag(seaweedfs_bucket, seaweedfs_credentials_path):
    proc = _gc_dry_run(seaweedfs_bucket, "--credentials", str(seaweedfs_credentials_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.report["credentials"] == {"source": "file", "path": str(seaweedfs_credentials_path)}
    validate(proc.report, "report_gc_uploads", what="gc-uploads report")
    _no_key_shown(proc, seaweedfs_credentials_path)


def test_the_flag_wins_over_the_environment_variable(seaweedfs_bucket, seaweedfs_credentials_path, tmp_path):
    other = tmp_path / "never-read.json"  # the flag is used alone: this broken file must not matter
    other.write_text("{not json", encoding="utf-8")
    proc = _gc_dry_run(seaweedfs_bucket, "--credentials", str(seaweedfs_credentials_path),
                       env={"CKPTFLOW_CREDENTIALS": str(other)})
    assert proc.returncode == 0, proc.stderr
    assert proc.report["credentials"] == {"source": "file", "path": str(seaweedfs_credentials_path)}


@pytest.mark.slow
def test_publish_and_verify_name_the_environment_variable_source(seaweedfs_bucket, seaweedfs_credentials_path,
                                                                 tmp_path):
    artifact = make_artifact(tmp_path / "run", model_bytes=4096, shards=1)
    env = {"CKPTFLOW_CREDENTIALS": str(seaweedfs_credentials_path)}
    published = run_cli("publish", "--artifact-dir", str(artifact), "--upload-prefix", UPLOAD_PREFIX,
                        "--bucket", seaweedfs_bucket, env=env)
    assert published.returncode == 0, published.stderr
    verified = run_cli("verify", "--artifact-dir", str(artifact), env=env)
    assert verified.returncode == 0, verified.stderr
    for proc, schema in ((published, "report_publish"), (verified, "report_verify")):
        assert proc.report["credentials"] == {"source": "env:CKPTFLOW_CREDENTIALS",
                                              "path": str(seaweedfs_credentials_path)}
        validate(proc.report, schema, what=schema)
        _no_key_shown(proc, seaweedfs_credentials_path)


def test_aws_variables_alone_are_botocores_chain_with_method_env(seaweedfs_bucket, seaweedfs_credentials_path):
    keys = _keys(seaweedfs_credentials_path)
    proc = _gc_dry_run(seaweedfs_bucket, env={
        "AWS_ACCESS_KEY_ID": keys["aws_access_key_id"], "AWS_SECRET_ACCESS_KEY": keys["aws_secret_access_key"],
        "AWS_ENDPOINT_URL": keys["endpoint_url"], "AWS_DEFAULT_REGION": keys["region_name"] or "us-east-1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.report["credentials"] == {"source": "aws-chain", "method": "env"}
    validate(proc.report, "report_gc_uploads", what="gc-uploads report")
    _no_key_shown(proc, seaweedfs_credentials_path)


def test_no_source_at_all_is_one_error_listing_the_sources_tried_in_order(seaweedfs_bucket,
                                                                          seaweedfs_credentials_path):
    endpoint = _keys(seaweedfs_credentials_path)["endpoint_url"]
    proc = _gc_dry_run(seaweedfs_bucket, env={"AWS_ENDPOINT_URL": endpoint})
    assert proc.returncode == 1, proc.stderr  # a StoreError: failed, exit 1 (cli.py's error map)
    validate(proc.report, "report_error", what="error report")
    assert proc.report["status"] == "failed"
    assert proc.report["credentials"] == {"source": "aws-chain", "method": None}
    [line] = proc.stderr.strip().splitlines()
    assert "no credentials found" in line and seaweedfs_bucket in line
    at = [line.index(source) for source in ("--credentials FILE", "$CKPTFLOW_CREDENTIALS", "AWS_ACCESS_KEY_ID",
                                            "AWS_PROFILE", "~/.aws/credentials", "instance roles")]
    assert at == sorted(at), line
    assert re.search(r"; pass --credentials FILE, set \$CKPTFLOW_CREDENTIALS .*AWS_ACCESS_KEY_ID", line), line


def test_a_missing_credentials_file_is_named_in_the_error_report(seaweedfs_bucket, tmp_path):
    missing = tmp_path / "missing.json"
    proc = _gc_dry_run(seaweedfs_bucket, env={"CKPTFLOW_CREDENTIALS": str(missing)})
    assert proc.returncode == 1, proc.stderr
    validate(proc.report, "report_error", what="error report")
    assert proc.report["credentials"] == {"source": "env:CKPTFLOW_CREDENTIALS", "path": str(missing)}
    assert f"credentials file {missing} does not exist" in proc.stderr


def test_a_file_store_or_a_verb_without_a_store_reports_null(tmp_path, seaweedfs_credentials_path):
    artifact = make_artifact(tmp_path / "run", model_bytes=4096, shards=1)
    archive = tmp_path / "archive"
    archive.mkdir()
    published = run_cli("publish", "--artifact-dir", str(artifact), "--upload-prefix", UPLOAD_PREFIX,
                        "--bucket", f"file://{archive}", "--credentials", str(seaweedfs_credentials_path))
    assert published.returncode == 0, published.stderr
    assert published.report["credentials"] is None  # file:// reads no credentials, even when named
    validate(published.report, "report_publish", what="publish report")
    status = run_cli("status", str(tmp_path / "run"), env={"CKPTFLOW_CREDENTIALS": str(seaweedfs_credentials_path)})
    assert status.returncode == 0, status.stderr
    assert status.report["credentials"] is None
    validate(status.report, "report_status", what="status report")


def test_the_terminal_summary_shows_the_source_on_one_line(seaweedfs_bucket, seaweedfs_credentials_path):
    shown = run_on_terminal("gc-uploads", "--bucket", seaweedfs_bucket, "--prefix", RUN_PREFIX,
                            "--credentials", str(seaweedfs_credentials_path))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert re.fullmatch(rf"  credentials +file {re.escape(str(seaweedfs_credentials_path))}", lines[-2]), shown.stdout
    assert re.fullmatch(r"  took +[0-9.]+ s", lines[-1]), shown.stdout
    _no_key_shown(shown, seaweedfs_credentials_path)


def test_the_docs_list_the_sources_in_the_order_the_code_tries_them():
    from ckptflow.store.credentials import SOURCES_IN_ORDER

    page = (REPO / "docs" / "object-stores.md").read_text(encoding="utf-8")
    section = page.split("\n## Credentials\n", 1)[1].split("\n## ", 1)[0]
    order = section.split("first match wins", 1)[1]
    at = [order.index(name) for name in ("`--credentials FILE`", "`CKPTFLOW_CREDENTIALS`", "botocore's standard chain")]
    assert at == sorted(at), section
    assert len(SOURCES_IN_ORDER) == 3 and SOURCES_IN_ORDER[0] == "--credentials FILE"
    for name in ('"source": "file"', '"source": "env:CKPTFLOW_CREDENTIALS"', '"source": "aws-chain"'):
        assert name in section, name


def test_half_a_key_pair_in_the_chain_is_one_error_naming_the_missing_variable(seaweedfs_bucket,
                                                                               seaweedfs_credentials_path):
    keys = _keys(seaweedfs_credentials_path)
    proc = _gc_dry_run(seaweedfs_bucket, env={"AWS_ACCESS_KEY_ID": keys["aws_access_key_id"],
                                              "AWS_ENDPOINT_URL": keys["endpoint_url"]})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    validate(proc.report, "report_error", what="error report")
    [line] = proc.stderr.strip().splitlines()
    assert "incomplete credentials" in line and "AWS_SECRET_ACCESS_KEY" in line, line
    assert proc.report["credentials"] == {"source": "aws-chain", "method": None}
    _no_key_shown(proc, seaweedfs_credentials_path)
