"""The trainer entry point captures archive failures and keeps the local artifact."""

from __future__ import annotations

import logging

from ckptflow.artifact import ComponentSpec, seal_artifact
from ckptflow.fsutil import walk_files
from ckptflow.store.credentials import Credentials
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from ckptflow.trainer import trainer_publish


def make(tmp_path):
    art = tmp_path / "run" / "checkpoint_artifacts" / "iter_000010"
    art.mkdir(parents=True)
    (art / "model.pt").write_bytes(b"w" * 100)
    seal_artifact(art, 10, [ComponentSpec("model", "model.pt")], progress=False)
    return art


def test_unreachable_endpoint_is_logged_and_the_artifact_kept(tmp_path, caplog):
    art = make(tmp_path)
    before = {p: (art / p).read_bytes() for p in walk_files(art)}
    down = S3Store("b", Credentials("k", "s3cr3t-value", "http://127.0.0.1:9", "us-east-1"), max_attempts=1)
    with caplog.at_level(logging.ERROR, logger="ckptflow"):
        outcome = trainer_publish(art, down, "p/g/r/ts/checkpoints")
    assert not outcome.ok and "127.0.0.1:9" in outcome.error
    assert "ckptflow publish" in caplog.text and "s3cr3t-value" not in caplog.text
    assert {p: (art / p).read_bytes() for p in walk_files(art)} == before


def test_successful_publication_returns_the_result(tmp_path):
    art = make(tmp_path)
    (tmp_path / "archive").mkdir()
    outcome = trainer_publish(art, LocalStore(tmp_path / "archive"), "p/g/r/ts/checkpoints")
    assert outcome.ok and outcome.result.status == "published"
