"""A library call run on a thread that waits at a named pause point (``ckptflow.testhooks``), so a test
can act meanwhile (fill a disk, kill a server), then let it go on and inspect what it returned or raised."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def start_paused(call: Callable[[], Any], point: str, flag: Path, monkeypatch, *,
                 timeout: float = 60) -> tuple[threading.Thread, dict]:
    """Start ``call`` on a thread paused at ``point`` (``flag`` is its pause file) and wait until it is there.
    The returned dict gets ``result`` or ``error`` (whatever the call raised) once the thread ends."""
    monkeypatch.setenv("CKPTFLOW_TEST_PAUSE_AT", point)
    monkeypatch.setenv("CKPTFLOW_TEST_PAUSE_FILE", str(flag))
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = call()
        except Exception as exc:  # noqa: BLE001 - the test inspects whatever the call raised
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + timeout
    while not flag.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flag.exists(), f"the call never reached its pause point {point}: {outcome}"
    return worker, outcome


def resume(worker: threading.Thread, flag: Path, monkeypatch, *, timeout: float = 120) -> None:
    """Let the paused call go on (later calls in this test do not pause) and wait for it to end."""
    monkeypatch.delenv("CKPTFLOW_TEST_PAUSE_AT")
    flag.unlink()
    worker.join(timeout=timeout)
    assert not worker.is_alive(), f"the call did not end within {timeout} s of resuming"
