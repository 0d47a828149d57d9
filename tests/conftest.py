"""Shared fixtures: the real loopback servers (started by `make test` / `tests/helpers/servers.py up`) and moto.

Server state comes from ``<repo>/.ckptflow/test-servers/state.json`` or ``$CKPTFLOW_TEST_SERVERS`` (that
file, or the directory holding it). A test that needs a server fails, never skips, when it is not
running: a silently skipped store test would hide exactly the guarantees it exists to check.

The suite runs in parallel (``pytest -n N --dist loadgroup``, pytest-xdist). What keeps the workers apart:
every SeaweedFS test has its own bucket, every pytest process (each worker, each core leg) its own
``CKPTFLOW_CACHE_DIR`` (probe records, upload journals) under its own base temporary directory, and the
tests that must not run beside each other (memory ceilings, crashes whose outcome depends on how fast a
server settles) carry the ``alone`` marker and are sent, in order, to one worker (``xdist_group``); the
``slurm`` tests, which share the single-node Slurm's two CPUs, likewise to one other worker. A test still
never sees another test's objects or files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

# One torch thread per process unless the environment says otherwise: the suite runs its workers and their
# subprocesses on two cores, and torch's default of a thread per core made every small tensor operation of a
# process hand work to (and spin waiting on) a second thread that had no core of its own: demo/build_run.py
# spent 46 CPU-s that way instead of 7.5, with the same weights. Set before any torch import; a subprocess
# inherits it (Snakemake still sets a job's own thread count).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from ckptflow.store import Credentials
from helpers import REPO, servers, xdist_groups  # tests/helpers/
from helpers.moto_bodies import mock_aws_bytes_bodies

NOT_RUNNING = "test servers are not running; run `make test` or `python tests/helpers/servers.py up`"


@dataclass(frozen=True)
class S3Target:
    """A bucket on an S3 endpoint, and the credentials to reach it."""

    bucket: str
    credentials: Credentials | None


def _state_file() -> Path:
    env = os.environ.get("CKPTFLOW_TEST_SERVERS")
    if env:
        path = Path(env)
        return path / "state.json" if path.is_dir() else path
    return servers.state_path(servers.PROFILES["test"].default_root())


ALONE_GROUP = "alone"
SLURM_GROUP = "slurm"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ``alone`` tests form one xdist group and the ``slurm`` tests another: each group runs one test after
    another on one worker, the two groups side by side (nothing but a machine's time is shared between a
    memory ceiling and a Slurm job). In a worker, the ``slow`` tests come first."""
    if not config.pluginmanager.hasplugin("xdist"):  # the core legs run without pytest-xdist
        return
    if hasattr(config, "workerinput"):
        # The scheduler hands out tests in this order (after the largest group): a long test started last
        # would keep its worker busy after the others ran dry, so the long ones start first (stable sort:
        # the same order in every worker, as xdist requires).
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group(SLURM_GROUP))
        elif item.get_closest_marker("alone"):
            item.add_marker(pytest.mark.xdist_group(ALONE_GROUP))
    xdist_groups.record(config, items)


# The groups reach the scheduler through tests/helpers/xdist_groups.py (xdist's own way is lost on pytest 9).
def pytest_configure(config: pytest.Config) -> None:
    xdist_groups.configure(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    xdist_groups.unconfigure(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    xdist_groups.configure_node(node)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    return xdist_groups.make_scheduler(config, log)


@pytest.fixture(scope="session", autouse=True)
def _process_cache(tmp_path_factory: pytest.TempPathFactory):
    """This pytest process's own ``CKPTFLOW_CACHE_DIR``, never the user's ~/.cache, never another worker's
    (a test that wants a cache of its own still sets one; session and module fixtures see this one)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("CKPTFLOW_CACHE_DIR", str(tmp_path_factory.mktemp("ckptflow-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def server_state() -> dict:
    path = _state_file()
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        pytest.fail(f"{NOT_RUNNING} (no {path})", pytrace=False)
    return state


def _running(state: dict, name: str) -> dict:
    entry = state.get("servers", {}).get(name)
    if entry is None or not servers.is_running(entry):
        pytest.fail(f"{name}: {NOT_RUNNING}", pytrace=False)
    return entry


@pytest.fixture(scope="session")
def seaweedfs_credentials_path(server_state: dict) -> Path:
    return Path(_running(server_state, "seaweedfs")["credentials"])


@pytest.fixture(scope="session")
def s3rver_credentials_path(server_state: dict) -> Path:
    return Path(_running(server_state, "s3rver")["credentials"])


def _own_bucket(credentials_path: Path):
    """A fresh, empty bucket on the server of ``credentials_path`` for one test; emptied and removed after."""
    bucket = f"ckptflow-t-{uuid.uuid4().hex[:16]}"
    servers.create_bucket(credentials_path, bucket)
    yield bucket
    servers.remove_bucket(credentials_path, bucket)


@pytest.fixture
def s3rver_bucket(s3rver_credentials_path: Path):
    """A bucket of the test's own on s3rver. Never shared: s3rver answers HeadBucket by listing the bucket,
    reading every object's metadata file, and fails with HTTP 500 when another worker is writing one of
    them meanwhile (a partly written file)."""
    yield from _own_bucket(s3rver_credentials_path)


@pytest.fixture
def seaweedfs_bucket(seaweedfs_credentials_path: Path):
    """A bucket of the test's own on SeaweedFS."""
    yield from _own_bucket(seaweedfs_credentials_path)


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch):
    """moto's in-process S3 with dummy credentials and one created bucket (not atomic: no race tests)."""
    for var in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "moto-testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "moto-testing-secret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws_bytes_bodies():
        target = S3Target("ckptflow-moto", Credentials("moto-testing", "moto-testing-secret", None, "us-east-1"))
        servers.create_bucket(target.credentials, target.bucket)
        yield target


@dataclass(frozen=True)
class BuiltSite:
    """The documentation site built once for this pytest process, and what ``mkdocs build --strict`` said."""

    path: Path
    build: subprocess.CompletedProcess


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> BuiltSite:
    """``mkdocs build --strict`` of the checkout's site, offline: any download would go through a proxy that
    refuses it. The tests that use it carry ``xdist_group(docs_pages.SITE_GROUP)``, so one worker builds it."""
    site = tmp_path_factory.mktemp("docs-site") / "site"
    refused = "http://127.0.0.1:9"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HTTP_PROXY": refused, "HTTPS_PROXY": refused,
           "http_proxy": refused, "https_proxy": refused, "NO_PROXY": "", "no_proxy": ""}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    return BuiltSite(site, done)
