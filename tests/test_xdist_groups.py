"""The suite's ``xdist_group`` tests (``alone``, ``slurm``, the records snapshot) really share one worker.

A small suite runs on three workers with this suite's hooks (tests/helpers/xdist_groups.py): each test
writes which worker ran it. Without the hooks pytest-xdist's own grouping is lost on pytest 9 and the
grouped tests spread over the workers; the ungrouped ones must still spread, or the check proves nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import defaultdict

import pytest

from helpers import REPO

CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO / "tests")!r})
import pytest
from helpers import xdist_groups

def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("alone"):
            item.add_marker(pytest.mark.xdist_group("alone"))
    xdist_groups.record(config, items)

def pytest_configure(config):
    config.addinivalue_line("markers", "alone: one worker")
    xdist_groups.configure(config)

def pytest_unconfigure(config):
    xdist_groups.unconfigure(config)

@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    xdist_groups.configure_node(node)

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    return xdist_groups.make_scheduler(config, log)
"""

TESTS = """
import json, os
import pytest

def note(kind, name):
    with open(os.environ["GROUPS_LOG"], "a") as f:
        f.write(json.dumps([kind, name, os.environ["PYTEST_XDIST_WORKER"]]) + "\\n")

@pytest.fixture(scope="session")
def snapshot():
    note("built", "snapshot")

@pytest.mark.xdist_group("snapshot")
@pytest.mark.parametrize("name", ["-F", "--touch", "-R publish", "params change"])
def test_grouped(snapshot, name):
    note("snapshot", name)

@pytest.mark.alone
@pytest.mark.parametrize("name", ["a", "b", "c"])
def test_alone(name):
    note("alone", name)

@pytest.mark.parametrize("name", list("defghijkl"))
def test_free(name):
    note("free", name)
"""


@pytest.mark.slow
def test_a_group_runs_on_one_worker_and_its_session_fixture_is_built_once(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    (tmp_path / "test_toy.py").write_text(TESTS, encoding="utf-8")
    log = tmp_path / "log.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist",
                           "loadgroup", "test_toy.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"GROUPS_LOG": str(log), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = defaultdict(set)
    counts = defaultdict(int)
    for kind, _name, worker in map(json.loads, log.read_text(encoding="utf-8").splitlines()):
        workers[kind].add(worker)
        counts[kind] += 1
    assert counts == {"built": 1, "snapshot": 4, "alone": 3, "free": 9}, dict(counts)
    assert len(workers["snapshot"]) == 1 and workers["built"] == workers["snapshot"], dict(workers)
    assert len(workers["alone"]) == 1, dict(workers)
    assert len(workers["free"]) >= 2, dict(workers)  # the run was parallel
