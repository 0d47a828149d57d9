"""Where a publication lands: the upload prefix is derived from the artifact's path in the runs layout,
an explicit prefix that would put the archive anywhere else is refused before any byte is written, and a
bucket (or ``file://`` root) that does not exist is refused by name, also on SeaweedFS, which would
create it at the first PUT. Real CLI processes; real SeaweedFS or ``file://`` archives."""

from __future__ import annotations

import uuid

import pytest

from helpers import servers
from helpers.artifacts import make_artifact
from helpers.cli import run_cli
from helpers.trees import tree_state

RUN = "proj/grp/run1/20261201T000000Z"


def _bucket_state(creds, bucket) -> tuple:
    client = servers.s3_client(creds)
    objects = sorted((o["Key"], o["Size"], o["ETag"])
                     for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
                     for o in page.get("Contents", []))
    uploads = sorted((u["Key"], u["UploadId"]) for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", []))
    return objects, uploads


def _buckets(creds) -> list[str]:
    return sorted(b["Name"] for b in servers.s3_client(creds).list_buckets().get("Buckets", []))


def test_publish_without_a_prefix_archives_under_the_runs_layout(tmp_path):
    art = make_artifact(tmp_path / "runs" / RUN)
    (tmp_path / "archive").mkdir()
    proc = run_cli("publish", "--artifact-dir", str(art), "--bucket", f"file://{tmp_path / 'archive'}")
    assert proc.returncode == 0, proc.stderr
    assert proc.report["destination"]["prefix"] == f"{RUN}/checkpoint_artifacts/iter_000300"
    assert (tmp_path / "archive" / RUN / "checkpoint_artifacts" / "iter_000300" / "model.pt").is_file()
    # The prefix the path derives, passed explicitly, is the same publication.
    again = run_cli("publish", "--artifact-dir", str(art), "--bucket", f"file://{tmp_path / 'archive'}",
                    "--upload-prefix", f"{RUN}/checkpoints")
    assert again.returncode == 0 and again.report["status"] == "skipped", again.stderr


@pytest.mark.seaweedfs
@pytest.mark.parametrize("wrong", [
    RUN,  # the /checkpoints forgotten: the timestamp would be dropped
    f"{RUN}/checkpoint_artifacts/iter_000300",  # the artifact's own prefix: checkpoint_artifacts twice
    "proj/grp/run1/20261130T000000Z/checkpoints",  # another attempt of the run
    "proj/grp/run2/20261201T000000Z/checkpoints",  # another run
    "projB/grpB/run1/20261201T000000Z/checkpoints",  # another project's prefix: same run and attempt names
    "proj/grpB/run1/20261201T000000Z/checkpoints",  # another group
    "team/proj/grp/run1/20261201T000000Z/checkpoints",  # an extra leading segment
    "run1/20261201T000000Z/checkpoints",  # project and group dropped
])
def test_a_prefix_that_would_archive_elsewhere_is_refused_before_any_byte(
        tmp_path, wrong, seaweedfs_bucket, seaweedfs_credentials_path, probe_cache):
    creds = seaweedfs_credentials_path
    art = make_artifact(tmp_path / "runs" / RUN)
    before = tree_state(tmp_path / "runs"), _bucket_state(creds, seaweedfs_bucket)
    proc = run_cli("publish", "--artifact-dir", str(art), "--upload-prefix", wrong, "--bucket", seaweedfs_bucket,
                   "--credentials", str(creds))
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert repr(wrong) in line and f"--upload-prefix {RUN}/checkpoints" in line and "nothing was written" in line
    assert (tree_state(tmp_path / "runs"), _bucket_state(creds, seaweedfs_bucket)) == before
    assert _bucket_state(creds, seaweedfs_bucket) == ([], [])


def test_outside_the_runs_layout_an_explicit_prefix_is_needed_and_accepted(tmp_path):
    art = make_artifact(tmp_path / "elsewhere")
    (tmp_path / "archive").mkdir()
    bucket = f"file://{tmp_path / 'archive'}"
    before = tree_state(tmp_path / "archive")
    bare = run_cli("publish", "--artifact-dir", str(art), "--bucket", bucket)
    assert bare.returncode == 2 and "not in the runs layout" in bare.stderr and "--upload-prefix" in bare.stderr
    assert tree_state(tmp_path / "archive") == before
    still_checked = run_cli("publish", "--artifact-dir", str(art), "--bucket", bucket, "--upload-prefix", RUN)
    assert still_checked.returncode == 2 and "does not end in /checkpoints" in still_checked.stderr
    assert tree_state(tmp_path / "archive") == before
    proc = run_cli("publish", "--artifact-dir", str(art), "--bucket", bucket, "--upload-prefix", f"{RUN}/checkpoints")
    assert proc.returncode == 0, proc.stderr
    assert proc.report["destination"]["prefix"] == f"{RUN}/checkpoint_artifacts/iter_000300"


@pytest.mark.seaweedfs
@pytest.mark.slow
def test_a_bucket_that_does_not_exist_is_refused_by_name_and_not_created(
        tmp_path, seaweedfs_credentials_path, probe_cache):
    creds = seaweedfs_credentials_path
    missing = f"ckptflow-missing-{uuid.uuid4().hex[:12]}"
    art = make_artifact(tmp_path / "runs" / RUN)
    # Other tests (on other workers) create and remove their own buckets meanwhile: what this test could
    # create is the missing bucket, checked after each verb.
    before = tree_state(tmp_path)
    for verb in (("publish", "--artifact-dir", str(art)),
                 ("publish", "--artifact-dir", str(art), "--dry-run"),
                 ("probe", "--prefix", f"{RUN}/checkpoints"),
                 ("gc-uploads", "--prefix", RUN, "--abort")):
        proc = run_cli(*verb, "--bucket", missing, "--credentials", str(creds))
        assert proc.returncode == 1, (verb, proc.stderr)
        [line] = proc.stderr.strip().splitlines()
        assert f"bucket '{missing}' does not exist" in line and "create the bucket first" in line, line
        assert missing not in _buckets(creds)
    assert tree_state(tmp_path) == before


def test_a_file_archive_root_that_does_not_exist_is_refused_and_not_created(tmp_path):
    art = make_artifact(tmp_path / "runs" / RUN)
    root = tmp_path / "no-such-archive"
    proc = run_cli("publish", "--artifact-dir", str(art), "--bucket", f"file://{root}")
    assert proc.returncode == 1 and f"archive root {root} does not exist" in proc.stderr, proc.stderr
    assert not root.exists()


def test_a_run_tree_outside_the_layout_takes_an_explicit_prefix_only_with_the_documented_override(tmp_path):
    # <project>/<run>/<ts>: the path derives <runs>/proj/run1/<ts>, which names no project of the tree.
    art = make_artifact(tmp_path / "runs" / "proj" / "run1" / "20261201T000000Z")
    (tmp_path / "archive").mkdir()
    bucket = f"file://{tmp_path / 'archive'}"
    wanted = "proj/default/run1/20261201T000000Z/checkpoints"
    before = tree_state(tmp_path)
    refused = run_cli("publish", "--artifact-dir", str(art), "--bucket", bucket, "--upload-prefix", wanted)
    assert refused.returncode == 2 and "--outside-runs-layout" in refused.stderr, refused.stderr
    alone = run_cli("publish", "--artifact-dir", str(art), "--bucket", bucket, "--outside-runs-layout")
    assert alone.returncode == 2 and "--upload-prefix" in alone.stderr, alone.stderr
    assert tree_state(tmp_path) == before
    dry = run_cli("publish", "--artifact-dir", str(art), "--bucket", bucket, "--upload-prefix", wanted,
                  "--outside-runs-layout", "--dry-run")
    assert dry.returncode == 0 and dry.report["destination"]["prefix"] == wanted.replace(
        "checkpoints", "checkpoint_artifacts/iter_000300"), dry.stderr
    assert "as given" in dry.stderr  # said, never silent
    proc = run_cli("publish", "--artifact-dir", str(art), "--bucket", bucket, "--upload-prefix", wanted,
                   "--outside-runs-layout")
    assert proc.returncode == 0 and proc.report["destination"]["prefix"] == dry.report["destination"]["prefix"]
    # It still must end in /checkpoints: the override takes the prefix as given, not any prefix.
    other = make_artifact(tmp_path / "runs2" / "proj" / "run1" / "20261201T000000Z")
    bare = run_cli("publish", "--artifact-dir", str(other), "--bucket", bucket, "--upload-prefix",
                   "proj/default/run1/20261201T000000Z", "--outside-runs-layout")
    assert bare.returncode == 2 and "does not end in /checkpoints" in bare.stderr, bare.stderr
