"""Byte-accurate progress bars on stderr.

Bars are shown when stderr is a terminal, or when ``CKPTFLOW_PROGRESS=1`` asks for them anyway (for
example under Slurm, where stderr is a log file). ``CKPTFLOW_PROGRESS=0`` silences them everywhere.
Progress never goes to stdout: stdout carries exactly one JSON report.
"""

from __future__ import annotations

import os
import sys
import threading


def progress_enabled(requested: bool | None = None) -> bool:
    if requested is not None:
        return requested
    env = os.environ.get("CKPTFLOW_PROGRESS")
    if env is not None:
        return env.strip().lower() in ("1", "true", "yes", "on")
    return sys.stderr.isatty()


class ByteProgress:
    """A thread-safe byte counter with an optional tqdm bar; ``update`` may be called from workers."""

    def __init__(self, total: int, desc: str, enabled: bool | None = None):
        self._lock = threading.Lock()
        self.done = 0
        self.total = total
        self._bar = None
        if progress_enabled(enabled):
            from tqdm import tqdm  # only where a bar is shown: its import costs a piped command 40 ms

            self._bar = tqdm(
                total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, file=sys.stderr,
                dynamic_ncols=True, leave=False,
            )

    def update(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes
            if self._bar is not None:
                self._bar.update(nbytes)

    def grow(self, nbytes: int) -> None:
        """Raise the total (work found to be larger than announced), keeping the bar byte-accurate."""
        with self._lock:
            self.total += nbytes
            if self._bar is not None:
                self._bar.total = self.total
                self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ByteProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
