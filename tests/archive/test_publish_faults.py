"""A server that goes away mid-publish: a clear failure, the local artifact intact, a rerun completes."""

from __future__ import annotations

import os
import signal

import pytest

from ckptflow.archive.publish import publish_artifact
from ckptflow.errors import StoreError
from ckptflow.fsutil import walk_files
from ckptflow.records import receipt as receipt_record
from ckptflow.store.credentials import load_credentials
from ckptflow.store.s3 import S3Store
from helpers import servers
from helpers.artifacts import UPLOAD_PREFIX, make_artifact
from helpers.paused import resume, start_paused


@pytest.mark.slow
def test_server_stopped_mid_publish_fails_cleanly_and_rerun_publishes(tmp_path, monkeypatch):
    # A private SeaweedFS on ports of its own: stopping it must not disturb the shared one.
    profile = servers.free_profile("fault")  # the same ports for both starts
    root = tmp_path / "server"
    entry = servers.start_seaweedfs(root, profile)
    try:
        creds = load_credentials(entry["credentials"])
        store = S3Store(profile.bucket, creds, max_attempts=2)
        art = make_artifact(tmp_path / "run", shards=6)
        before = {p: (art / p).read_bytes() for p in walk_files(art)}

        flag = tmp_path / "paused"
        worker, outcome = start_paused(lambda: publish_artifact(art, store, UPLOAD_PREFIX, progress=False),
                                       "publish:after-payload", flag, monkeypatch)  # its first uploaded payload
        # SIGKILL, not SIGTERM: a server shutting down gracefully answers some requests with 500 for a
        # few seconds; a killed one refuses connections at once, so the failure mode is the same each run.
        os.killpg(entry["pid"], signal.SIGKILL)
        servers.stop(entry)
        resume(worker, flag, monkeypatch, timeout=300)
        err = outcome.get("error")
        assert isinstance(err, StoreError), outcome
        assert f"127.0.0.1:{profile.s3}" in str(err) and "server is up" in str(err)
        # the part digests record, written before the declaration, is the one file the failed run added
        assert {p: (art / p).read_bytes() for p in walk_files(art) if p != ".posttrain-part-digests.json"} == before
        assert not receipt_record.path_in(art).exists()

        entry = servers.start_seaweedfs(root, profile)
        result = publish_artifact(art, S3Store(profile.bucket, creds), UPLOAD_PREFIX, progress=False)
        assert result.status == "published"
        assert receipt_record.path_in(art).exists()
    finally:
        servers.stop(entry)
