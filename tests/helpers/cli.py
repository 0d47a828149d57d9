"""The real ``python -m ckptflow`` in a subprocess, run from the checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from . import REPO


def _env(env: dict | None) -> dict[str, str]:
    return {**os.environ, "CKPTFLOW_PROGRESS": "0", **(env or {})}


def run_cli(*args: str, env: dict | None = None, timeout: float = 300, json_report: bool = True) -> subprocess.CompletedProcess:
    """Run one verb to completion; when stdout is not empty it must be exactly one JSON report
    (parsed into ``.report``, else ``.report`` is None), unless ``json_report=False`` (``--help``).
    ``env`` is added to the current environment."""
    proc = subprocess.run([sys.executable, "-m", "ckptflow", *args], capture_output=True, text=True,
                          env=_env(env), timeout=timeout, cwd=REPO)
    proc.report = json.loads(proc.stdout) if json_report and proc.stdout.strip() else None  # type: ignore[attr-defined]
    if proc.report is not None:
        assert proc.stdout.count("\n") == 1, proc.stdout
    return proc


def start_cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    """Start one verb in the background (for pause points, races and SIGKILL)."""
    return subprocess.Popen([sys.executable, "-m", "ckptflow", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(env), cwd=REPO)
