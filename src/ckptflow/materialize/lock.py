"""One materializer per output: ``<out>.lock`` beside the output, taken with ``fcntl.flock``.

The lock file stays (removing it would let a third process lock a fresh inode while a second still
holds the old one). The holder writes its pid, host and start time into it, so a request that gives up
after ``--lock-wait-seconds`` names who holds it. The lock is an optimisation, not the guarantee:
``flock`` is silently ineffective on some cluster file systems, and every publishing step stays one
rename of a uniquely named tree (``output.py``), so two requests that both get the lock still never
discard each other's published export. The file system should support flock (Lustre: the ``flock``
mount option) for the skip/refuse decision to be taken by one request at a time.

Fetch takes the same lock on its stage (``<stage>/iter_N.lock``, ``step="fetch"``): one fetch plans and
writes a staging directory at a time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from .. import testhooks
from ..errors import Refused, UsageError

log = logging.getLogger("ckptflow.materialize")

DEFAULT_WAIT_SECONDS = 120.0
_DOING = {"materialize": "materialized", "fetch": "fetched into"}
POLL_SECONDS = 0.2


def lock_path(out: Path) -> Path:
    return out.with_name(out.name + ".lock")


def check_wait_seconds(value: object) -> float:
    """``--lock-wait-seconds``: a finite number >= 0 (``inf``, ``nan`` and negatives are usage errors)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise UsageError(f"--lock-wait-seconds must be a finite number of seconds >= 0, got {value!r}",
                         remedy="pass e.g. --lock-wait-seconds 120 (0: do not wait)")
    return float(value)


def _holder(fd: int) -> str:
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        return f"pid {data['pid']} on host {data['host']}, started {data['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "a holder that has not written its name yet"


@contextlib.contextmanager
def output_lock(out: Path, wait_seconds: float, *, step: str = "materialize") -> Iterator[Path | None]:
    """Hold ``<out>.lock`` for the block; wait up to ``wait_seconds`` (polling) for another holder, then
    raise ``Refused`` naming it (nothing touched). Yields the lock's path (None when a test disabled it).
    ``step`` names the holder's operation in messages and its test points (``<step>:lock-wait``, the
    guard ``<step>:lock``)."""
    if testhooks.disabled(f"{step}:lock"):
        yield None
        return
    path = lock_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        what = "is a symlink" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
        raise Refused(f"the lock file {path} {what}", path=str(path),
                      remedy="make it a regular file this user can write (or remove it), then rerun") from None
    try:
        _acquire(fd, out, path, wait_seconds, step)
        started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}) + "\n"
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode("utf-8"), 0)
        yield path
    finally:
        os.close(fd)  # releases the flock


def _acquire(fd: int, out: Path, path: Path, wait_seconds: float, step: str) -> None:
    deadline = time.monotonic() + wait_seconds
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if not waiting:
            waiting = True
            log.info("waiting up to %g s for %s, held by %s", wait_seconds, path, _holder(fd))
            testhooks.reached(f"{step}:lock-wait")
        left = deadline - time.monotonic()
        if left <= 0:
            doing = _DOING.get(step, step)
            raise Refused(f"{out} is being {doing} by another request ({_holder(fd)}): {path} was still "
                          f"held after {wait_seconds:g} s (--lock-wait-seconds); nothing was changed",
                          path=str(path), remedy="let that request finish, then rerun (it skips once the same "
                          "build is published), or raise --lock-wait-seconds")
        time.sleep(min(POLL_SECONDS, left))
