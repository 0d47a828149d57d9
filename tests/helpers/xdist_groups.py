"""``--dist loadgroup`` that keeps its promise: every test of one ``xdist_group`` runs on one worker.

pytest-xdist groups tests by appending ``@<group>`` to each item's node id on the workers
(``item._nodeid``); pytest 9 keeps the node id elsewhere, so that write is lost and every test becomes
its own scope: the ``alone`` tests ran beside each other and a session fixture shared by a group was
built once per worker. Here the workers write what the markers say instead, and the controller's
scheduler reads it:

- the controller makes a private directory and names it to each worker (``pytest_configure_node``);
- each worker, once its collection is final, writes ``groups-<worker>.json`` there:
  ``{node id: group}`` for every item that carries ``xdist_group`` (``record``);
- the scheduler (``GroupScheduling``, xdist's load-scope scheduling) asks for each node id's scope after
  every worker has collected: the group's name for a grouped test, the test's own id otherwise. A map
  that is missing is an error, never a silent fall back to no groups.

``tests/test_xdist_groups.py`` runs a small suite on three workers and checks that a group shares one.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

WORKER_KEY = "ckptflow_xdist_groups"
_DIR = pytest.StashKey[Path]()


def group_of(item: pytest.Item) -> str | None:
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "_".join(names) or None


def configure(config: pytest.Config) -> None:
    """On the controller of a ``--dist loadgroup`` run: the directory the workers write their maps to."""
    if hasattr(config, "workerinput") or config.getoption("dist", "no") != "loadgroup":
        return
    config.stash[_DIR] = Path(tempfile.mkdtemp(prefix="ckptflow-xdist-groups-"))


def unconfigure(config: pytest.Config) -> None:
    directory = config.stash.get(_DIR, None)
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def configure_node(node) -> None:
    directory = node.config.stash.get(_DIR, None)
    if directory is not None:
        node.workerinput[WORKER_KEY] = str(directory)


def record(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: write ``{node id: group}`` for its final collection (atomically: written, then renamed)."""
    workerinput = getattr(config, "workerinput", None)
    if not workerinput or WORKER_KEY not in workerinput:
        return
    groups = {item.nodeid: group for item in items if (group := group_of(item))}
    target = Path(workerinput[WORKER_KEY]) / f"groups-{workerinput['workerid']}.json"
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(groups), encoding="utf-8")
    os.replace(tmp, target)


def make_scheduler(config: pytest.Config, log):
    if config.getoption("dist", "no") != "loadgroup" or _DIR not in config.stash:
        return None
    from xdist.scheduler import LoadScopeScheduling

    directory = config.stash[_DIR]

    class GroupScheduling(LoadScopeScheduling):
        """Load-scope scheduling whose scope is the test's ``xdist_group`` (else the test itself)."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                maps = sorted(directory.glob("groups-*.json"))
                if not maps:
                    raise RuntimeError(f"no worker wrote its xdist_group map to {directory} "
                                       "(tests/helpers/xdist_groups.py); the groups cannot be kept")
                self._groups = json.loads(maps[0].read_text(encoding="utf-8"))
            group = self._groups.get(nodeid)
            return f"group:{group}" if group else nodeid

    return GroupScheduling(config, log)

