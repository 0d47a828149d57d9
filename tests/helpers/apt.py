"""apt-get installs of the tests' system dependencies (the single-node Slurm's packages, the browser that checks
the documentation site), one at a time.

`make test` starts both installs while lint runs, side by side: dpkg runs one at a time, and a package
install must not start the services it brings (a temporary ``policy-rc.d`` says so). So each install holds
an flock on ``LOCK`` for its whole run, the policy file included (another install must not remove it while
this one still unpacks daemons), and apt waits for dpkg's own lock when some other program holds it.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

LOCK = Path("/var/lock/ckptflow-apt.lock")
POLICY = Path("/usr/sbin/policy-rc.d")
# How long apt waits for dpkg's lock held by another program (seconds).
DPKG_LOCK_WAIT = 600


class AptError(RuntimeError):
    """apt-get could not install the packages; the message names the command and ends with its stderr."""


def install(packages: Sequence[str], missing: Callable[[], list[str]]) -> None:
    """``apt-get install --no-install-recommends`` the packages when ``missing()`` names a program, without
    starting a service (root only; the caller checks); raises AptError when it fails or a program is still
    missing after it."""
    if not missing():
        return
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not missing():  # installed while this one waited
            return
        ours = not POLICY.exists()
        if ours:
            POLICY.write_text("#!/bin/sh\n# ckptflow tests/helpers/apt.py: do not start services while installing\n"
                              "exit 101\n")
            POLICY.chmod(0o755)
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT}", "install", "-y", "-q",
               "--no-install-recommends", *packages]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:  # stale package lists on a fresh machine
                subprocess.run(["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_WAIT}", "update", "-q"], env=env,
                               capture_output=True, text=True)
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        finally:
            if ours:
                POLICY.unlink()
    if done.returncode != 0:
        raise AptError(f"`{' '.join(cmd)}` failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    if missing():
        raise AptError(f"still missing after apt-get install: {', '.join(missing())}")
