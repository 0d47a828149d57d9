"""The single-node Slurm of `make test` comes up in a checkout that only root may reach.

A clone under ``/root`` or under a ``mktemp -d`` directory (mode 700) is where root most naturally works;
munged and mariadbd run as users of their own (``munge``, ``mysql``), who cannot traverse such a parent,
so their state lives outside the checkout (``slurm.daemons_dir``). The test clones the repository into a
mode-700 directory, brings the cluster up from there, runs a job step, and takes it down again; the suite's
own cluster (one per machine: ``/etc/slurm/slurm.conf``, munged's socket) is stopped for the while and
started again after.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, servers, slurm

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


def _slurm_py(checkout: Path, command: str, root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(checkout / "tests" / "helpers" / "slurm.py"), command, "--root", str(root)],
                          capture_output=True, text=True, timeout=600, cwd=checkout)


def _running(root: Path) -> bool:
    daemons = servers.read_state(root).get("servers", {})
    return all(name in daemons and servers.is_running(daemons[name]) for name in slurm.ORDER)


def test_a_checkout_other_users_cannot_traverse_brings_the_cluster_up_and_down(tmp_path: Path) -> None:
    reason = slurm.cannot_run_reason()
    if reason and not os.environ.get("CI"):
        pytest.skip(f"Slurm tests skipped: this machine cannot run Slurm ({reason})")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    checkout = private / "ckptflow"
    subprocess.run(["git", "clone", "--quiet", "--shared", str(REPO), str(checkout)], check=True, timeout=120)
    # The cluster's scripts as they are in this working tree, not as last committed.
    shutil.copytree(REPO / "tests" / "helpers", checkout / "tests" / "helpers", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    # pytest's own base directory is mode 700 too; this one is, whatever the base is.
    assert slurm.untraversable(checkout, "munge") in (private, *private.parents)
    assert slurm.untraversable(checkout, "mysql") in (private, *private.parents)

    suite_root = Path(os.environ.get("CKPTFLOW_TEST_SLURM") or slurm.DEFAULT_ROOT)
    suite_was_up = _running(suite_root)
    if suite_was_up:
        down = _slurm_py(REPO, "down", suite_root)
        assert down.returncode == 0, down.stderr
    root = checkout / ".ckptflow" / "slurm"
    try:
        up = _slurm_py(checkout, "up", root)
        assert up.returncode == 0, up.stderr
        assert _running(root)
        daemons = slurm.daemons_dir(root)
        assert daemons.parent == slurm.DAEMONS_BASE and stat.S_IMODE(daemons.stat().st_mode) == 0o755
        assert slurm.untraversable(daemons / "munge", "munge") is None
        assert not (root / slurm.UP_FAILED).exists()
        assert slurm.node_state() == "idle"
        step = subprocess.run(["srun", "-N1", "-n1", "--mem=100", "true"], capture_output=True, text=True, timeout=120)
        assert step.returncode == 0, step.stderr
    finally:
        down = _slurm_py(checkout, "down", root)
        if suite_was_up:
            again = _slurm_py(REPO, "up", suite_root)
            assert again.returncode == 0, f"the suite's own Slurm did not come back: {again.stderr}"
    assert down.returncode == 0, down.stderr
    assert not slurm.daemons_dir(root).exists()
    assert not servers.read_state(root).get("servers")


def test_a_daemon_that_cannot_reach_its_state_is_named_with_the_remedy(tmp_path: Path) -> None:
    """The check before each daemon user's start: one line naming the directory it cannot traverse."""
    if os.geteuid() != 0:
        pytest.skip("only root can make a directory the munge user cannot traverse and still look into it")
    try:
        slurm.pwd.getpwnam("munge")
    except KeyError:
        pytest.skip("no munge user on this machine (the Slurm packages are not installed)")
    private = tmp_path / "private"
    (private / "munge").mkdir(parents=True)
    private.chmod(0o700)
    with pytest.raises(slurm.SlurmError) as refused:
        slurm._check_reachable(private / "munge", "munge", "munged")
    message, blocked = str(refused.value), slurm.untraversable(private / "munge", "munge")
    assert blocked in (private, *private.parents)
    assert "\n" not in message
    assert f"cannot traverse {blocked} (mode 700) to reach {private / 'munge'}" in message and "chmod o+x" in message
