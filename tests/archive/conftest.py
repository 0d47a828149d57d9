"""Fixtures for the archive tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptflow.store.credentials import load_credentials
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from helpers.artifacts import make_artifact


@pytest.fixture(autouse=True)
def probe_cache(tmp_path, monkeypatch):
    """Probe records go to a per-test cache, never to ~/.cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def artifact(tmp_path) -> Path:
    return make_artifact(tmp_path / "run1")


@pytest.fixture
def sw_store(seaweedfs_bucket, seaweedfs_credentials_path) -> S3Store:
    return S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path))


@pytest.fixture(params=["seaweedfs", "moto", "file"])
def any_store(request, tmp_path):
    """Each backend in turn: a SeaweedFS bucket of the test's own, moto's in-process S3, a ``file://`` root."""
    if request.param == "seaweedfs":
        return request.getfixturevalue("sw_store")
    if request.param == "moto":
        target = request.getfixturevalue("moto_s3")
        return S3Store(target.bucket, target.credentials)
    (tmp_path / "archive").mkdir()
    return LocalStore(tmp_path / "archive")
