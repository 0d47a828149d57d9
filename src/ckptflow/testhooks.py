"""Named crash and pause points for the crash-safety tests; inert unless the test environment asks.

``CKPTFLOW_TEST_KILL_AT=<point>`` makes the process SIGKILL itself when it reaches ``point`` (a real
kill -9: no finally blocks, no atexit). ``CKPTFLOW_TEST_PAUSE_AT=<point>`` makes it create the file
named by ``CKPTFLOW_TEST_PAUSE_FILE`` and wait there until the test removes that file (at most 120 s),
so a test can act while it waits (kill it, stop a server, run a racing process). The file holds the pid,
the point and, where the caller names one, the subject (e.g. the artifact's key prefix), so a test whose
process reaches a point many times (once per payload object, once per artifact of a batch) can tell which
it is. Points are named ``<step>:<moment>``, e.g. ``publish:after-declaration``. Both variables may hold
several points separated by commas.
``CKPTFLOW_TEST_DISABLE=<guard>`` switches off a named guard (``disabled``), so a test can show that
correctness does not depend on it (``materialize:lock``, ``merge:lock``: the per-output locks).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def _points(var: str) -> set[str]:
    value = os.environ.get(var)
    return {p.strip() for p in value.split(",")} if value else set()


def reached(point: str, subject: str | None = None) -> None:
    """Call at a named point of a long operation (``subject``: what reached it, written to the pause file);
    does nothing in normal runs."""
    if point in _points("CKPTFLOW_TEST_PAUSE_AT"):
        flag = os.environ.get("CKPTFLOW_TEST_PAUSE_FILE")
        if flag:
            Path(flag).write_text(f"{os.getpid()} {point}{f' {subject}' if subject else ''}\n")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and flag and Path(flag).exists():
            time.sleep(0.05)
    if point in _points("CKPTFLOW_TEST_KILL_AT"):
        os.kill(os.getpid(), signal.SIGKILL)


def disabled(guard: str) -> bool:
    """Whether a test switched off the named guard (``CKPTFLOW_TEST_DISABLE``); False in normal runs."""
    return guard in _points("CKPTFLOW_TEST_DISABLE")
