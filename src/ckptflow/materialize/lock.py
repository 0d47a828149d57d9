"""One materializer per output: ``<out>.lock`` beside the output, taken with ``fcntl.flock``.

The lock file is created with ``O_CREAT|O_EXCL`` and the holder's record (pid, host, start time and a
random token) written into the new, empty file; an existing file is never truncated or written. A
request that finds ``<out>.lock`` already there:

- refuses by name when it is not a lock (any content other than a lock record or nothing): a user's
  file of that name is left byte-identical;
- waits for its flock (up to ``--lock-wait-seconds``, then refuses naming the holder);
- once it holds the flock on a lock record, that record's holder is gone (killed): the stale lock is
  unlinked (it is a lock record, and no process holds it) and a fresh one created;
- an empty file is held as it is (it may be a user's), never written nor removed.

After taking the flock the request checks that the path still names the inode it locked (a releasing
holder may have unlinked it meanwhile), else it starts over. When the block ends (done, refused or
failed) the lock file goes, under the flock, only while it is still ours: the path names our inode and
the record holds our token. So a successful or refused request leaves nothing beside the output; a
SIGKILLed one leaves its record, which the next request replaces as above.

The holder record lets a request that gives up name who holds the lock. The lock is an optimisation,
not the guarantee: ``flock`` is silently ineffective on some cluster file systems, and every publishing
step stays one rename of a uniquely named tree (``output.py``), so two requests that both get the lock
still never discard each other's published export. The file system should support flock (Lustre: the
``flock`` mount option) for the skip/refuse decision to be taken by one request at a time.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import secrets
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from .. import testhooks
from ..errors import Refused, UsageError

log = logging.getLogger("ckptflow.materialize")

DEFAULT_WAIT_SECONDS = 120.0
POLL_SECONDS = 0.2


def lock_path(out: Path) -> Path:
    return out.with_name(out.name + ".lock")


def check_wait_seconds(value: object) -> float:
    """``--lock-wait-seconds``: a finite number >= 0 (``inf``, ``nan`` and negatives are usage errors)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise UsageError(f"--lock-wait-seconds must be a finite number of seconds >= 0, got {value!r}",
                         remedy="pass e.g. --lock-wait-seconds 120 (0: do not wait)")
    return float(value)


def _record(fd: int) -> dict | None:
    """The lock record in ``fd``; ``{}`` when the file is empty; None when it is something else."""
    data = os.pread(fd, 4097, 0)
    if not data:
        return {}
    try:
        record = json.loads(data.decode("utf-8"))
    except ValueError:
        return None
    if (len(data) > 4096 or not isinstance(record, dict) or not {"pid", "host", "started"} <= set(record)
            or not set(record) <= {"pid", "host", "started", "token"}):
        return None
    return record


def _holder(fd: int) -> str:
    try:
        data = _record(fd)
        return f"pid {data['pid']} on host {data['host']}, started {data['started']}"
    except (OSError, KeyError, TypeError):
        return "a holder that has not written its name yet"


def _open(path: Path) -> tuple[int, bool]:
    """``(fd, created)``: a new lock file, or the existing one opened as it is (no O_TRUNC)."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        try:
            try:
                return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644), True
            except FileExistsError:
                return os.open(path, flags), False
        except FileNotFoundError:
            continue  # unlinked by its releasing holder between the two opens
        except OSError as exc:
            what = "is a symlink" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
            raise Refused(f"the lock file {path} {what}", path=str(path),
                          remedy="make it a regular file this user can write (or remove it), then rerun") from None


def _still_at(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.stat(path, follow_symlinks=False), os.fstat(fd))
    except FileNotFoundError:
        return False


def _refuse_foreign(fd: int, path: Path) -> None:
    if _record(fd) is None:
        raise Refused(f"{path} exists and is not a ckptflow lock (its content is not a lock record); it was "
                      "left as it is and nothing was changed", path=str(path),
                      remedy="move that file elsewhere (materialize keeps its lock at <out>.lock), then rerun")


@contextlib.contextmanager
def output_lock(out: Path, wait_seconds: float) -> Iterator[Path | None]:
    """Hold ``<out>.lock`` for the block; wait up to ``wait_seconds`` (polling) for another holder, then
    raise ``Refused`` naming it (nothing touched). Yields the lock's path (None when a test disabled it).
    The lock file goes when the block ends, if it is still the one this request created."""
    if testhooks.disabled("materialize:lock"):
        yield None
        return
    path = lock_path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_seconds
    waited = [False]  # the wait is announced (log, test point) once, however often the lock is re-taken
    while True:
        fd, created = _open(path)
        try:
            token = None
            if created:  # a new, empty file only this request has written to
                token = secrets.token_hex(16)
                started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                record = {"pid": os.getpid(), "host": socket.gethostname(), "started": started, "token": token}
                os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
            else:
                _refuse_foreign(fd, path)
            _acquire(fd, out, path, wait_seconds, deadline, waited)
            if not _still_at(fd, path):
                continue  # released and unlinked by its holder meanwhile: lock the file there now
            found = _record(fd)
            if found is None:
                _refuse_foreign(fd, path)
            if found and found.get("token") != token:
                # A lock record nobody holds (we hold its flock): its holder was killed. Replace it.
                os.unlink(path)
                continue
            try:
                yield path
            finally:
                _release(fd, path, token)
            return
        finally:
            os.close(fd)  # releases the flock


def _release(fd: int, path: Path, token: str | None) -> None:
    """Remove the lock file, under its flock, while it is provably ours: our inode, our token."""
    if token is None or not _still_at(fd, path):
        return
    found = _record(fd)
    if found and found.get("token") == token:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _acquire(fd: int, out: Path, path: Path, wait_seconds: float, deadline: float, waited: list[bool]) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if not waited[0]:
            waited[0] = True
            log.info("waiting up to %g s for %s, held by %s", wait_seconds, path, _holder(fd))
            testhooks.reached("materialize:lock-wait")
        left = deadline - time.monotonic()
        if left <= 0:
            raise Refused(f"{out} is being materialized by another request ({_holder(fd)}): {path} was still "
                          f"held after {wait_seconds:g} s (--lock-wait-seconds); nothing was changed",
                          path=str(path), remedy="let that request finish, then rerun (it skips once the same "
                          "build is published), or raise --lock-wait-seconds")
        time.sleep(min(POLL_SECONDS, left))
