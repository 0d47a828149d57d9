"""Streaming: publishing and fetching an artifact larger than the memory ceiling stays under it.

The real CLI runs in a child process whose anonymous RSS is sampled (``tests/helpers/memory.py``). The
ceiling is 300 MiB: the interpreter and boto3 (about 100 MiB) plus the transfer's bounded window of
ranges or parts (its buffer cache holds at most 160 MiB). The model alone (384 MiB) is larger, so
holding any whole file, or buffering ranges or parts without bound, fails the test.
"""

from __future__ import annotations

import sys

import pytest

from helpers import REPO
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact
from helpers.memory import peak_rss_anon

# Memory ceilings: sampled RssAnon of a child; run apart from the other memory-heavy tests.
pytestmark = pytest.mark.alone

MiB = 1024 * 1024
CEILING = 300 * MiB
MODEL = 384 * MiB


@pytest.mark.slow
def test_publish_and_fetch_of_a_larger_artifact_stay_under_the_memory_ceiling(
        sw_store, seaweedfs_credentials_path, tmp_path):
    art = make_artifact(tmp_path / "run", model_bytes=MODEL, shards=3)
    cli = [sys.executable, "-m", "ckptflow"]
    peak, proc = peak_rss_anon([*cli, "publish", "--artifact-dir", str(art), "--upload-prefix", UPLOAD_PREFIX,
                                "--bucket", sw_store.bucket, "--credentials", str(seaweedfs_credentials_path)], cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 0 < peak < CEILING, f"publish peaked at {peak / MiB:.0f} MiB anonymous memory"

    stage = tmp_path / "stage"
    peak, proc = peak_rss_anon([*cli, "fetch", "--artifact-uri", f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}",
                                "--dst", str(stage), "--credentials", str(seaweedfs_credentials_path)], cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 0 < peak < CEILING, f"fetch peaked at {peak / MiB:.0f} MiB anonymous memory"
    fetched = stage / art.name / "model.pt"
    assert fetched.stat().st_size == MODEL and fetched.read_bytes() == (art / "model.pt").read_bytes()
