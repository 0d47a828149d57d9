"""One writer per output: a lock file beside the output, taken with ``fcntl.flock`` (materialize's
``<out>.lock``, merge's ``iter_N.merge.lock``).

The lock file is created whole: its creator writes its record (pid, host, start time and a random token)
into a new, uniquely named temporary it flocks, links that at the lock's path (``link`` never replaces a
file) and removes the temporary's name (``_create``). So a lock file of this tool is never empty, even
when its creator is killed at any step; a temporary a killed creator left (this host, pid gone) is
removed by the next request. An existing file is never truncated. A request that finds the lock file
already there:

- refuses by name when it is not a lock (any content other than a lock record or nothing): a user's
  file of that name is left byte-identical;
- waits for its flock (up to ``--lock-wait-seconds``, then refuses naming the holder);
- once it holds the flock on a lock record, that record's holder is gone (killed): the stale lock is
  unlinked (it is a lock record, and no process holds it) and a fresh one created;
- an empty file is not this tool's (it may be a user's, or an older version's): it is held as it is,
  never written nor removed.

``remove_if_stale`` removes a lock record whose holder is provably gone (its flock is free, and the record
names this host and a pid that no longer runs) without taking the lock: a request that finds no work to do (restore's
``already-local``) clears the lock a killed holder left.

After taking the flock the request checks that the path still names the inode it locked (a releasing
holder may have unlinked it meanwhile), else it starts over. When the block ends (done, refused or
failed) the lock file goes, under the flock, only while it is still ours: the path names our inode and
the record holds our token. So a finished or refused request leaves nothing beside the output; a
SIGKILLed one leaves its record, which the next request replaces as above.

Reader marks (``reading``, ``readers_of``) are the other kind of claim held here: a process reading an
artifact in place (materialize ``--ckpt-dir``, a merge's experts) creates ``.<iter_N>.<host>.<pid>.<token>.reading``
beside it (the directory resolved) for as long as it reads, and removes it after (and the marks of killed readers of this host). Any number of readers may hold one at once; a prune
keeps an artifact a live reader names (removing files another process holds open would free no space
and take the bytes from under it). A mark whose writer is gone (this host, dead pid) names nobody.

The lock is an optimisation, not the guarantee: ``flock`` is silently ineffective on some cluster file
systems; every publishing step stays one rename of a uniquely named tree, and merge re-checks its decision
just before its commit, so two requests that both get the lock still never discard each other's published
output. The file system should support flock (Lustre: the ``flock`` mount option) for the skip/refuse
decision to be taken by one request at a time.
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

from . import testhooks
from .errors import Refused, UsageError
from .fsutil import (
    dead_temporaries,
    host_tag,
    parse_tagged_name,
    tagged_name,
    temp_stem,
    unique_temp_path,
    writer_gone,
)

log = logging.getLogger("ckptflow.lock")

DEFAULT_WAIT_SECONDS = 120.0
POLL_SECONDS = 0.2


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


def _open(path: Path, step: str) -> tuple[int, str | None]:
    """``(fd, token)``: a new lock file this request created, already flocked and holding its record with
    ``token``; or the existing one opened as it is (no O_TRUNC), token None."""
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        try:
            return os.open(path, flags), None
        except FileNotFoundError:
            pass
        except OSError as exc:
            what = "is a symlink" if exc.errno == errno.ELOOP else f"cannot be opened ({exc.strerror})"
            raise Refused(f"the lock file {path} {what}", path=str(path),
                          remedy="make it a regular file this user can write (or remove it), then rerun") from None
        created = _create(path, step)
        if created is not None:
            return created
        # another request created it between the two calls: open that one


def _create(path: Path, step: str) -> tuple[int, str] | None:
    """Create the lock file whole: its record is written into a new, uniquely named file this request
    flocks, which is then linked at ``path`` (never over an existing file) and its own name removed. So the
    lock file never exists without its holder's record, and a kill at any step leaves either nothing, a
    temporary of a dead process (removed by the next request) or a record nobody holds (replaced by the
    next request). None when another request's lock file is at ``path`` already."""
    for dead in dead_temporaries(path.parent, [f".{temp_stem(path.name)}"], ".tmp"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dead)  # a killed request's temporary (this host, its pid gone): a copy of its record
    tmp = unique_temp_path(path)
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new file nobody else has opened
        token = secrets.token_hex(16)
        started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": started, "token": token}
        os.pwrite(fd, (json.dumps(record) + "\n").encode("utf-8"), 0)
        try:
            os.link(tmp, path)
        except FileExistsError:
            os.close(fd)
            return None
        testhooks.reached(f"{step}:lock-created")
        return fd, token
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # this request's own name; the lock file, when linked, stays at ``path``


def _still_at(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.stat(path, follow_symlinks=False), os.fstat(fd))
    except FileNotFoundError:
        return False


def _refuse_foreign(fd: int, path: Path) -> None:
    if _record(fd) is None:
        raise Refused(f"{path} exists and is not a ckptflow lock (its content is not a lock record); it was "
                      "left as it is and nothing was changed", path=str(path),
                      remedy=f"move that file elsewhere (ckptflow keeps a lock at {path.name}), then rerun")


@contextlib.contextmanager
def held_lock(path: Path, wait_seconds: float, *, step: str, busy: str, remedy: str) -> Iterator[Path | None]:
    """Hold the lock file ``path`` for the block; wait up to ``wait_seconds`` (polling) for another holder,
    then raise ``Refused`` naming it (nothing touched): ``"<busy> (<holder>): <path> was still held ..."``.
    ``step`` names the test guard (``<step>:lock``, see ``testhooks.disabled``) and the points reached
    when the lock is found held (``<step>:lock-wait``), once a new lock file is at its path
    (``<step>:lock-created``) and just before it is removed (``<step>:lock-release``). Yields the lock's path (None when a test disabled it).
    The lock file goes when the block ends, if it is still the one this request created."""
    if testhooks.disabled(f"{step}:lock"):
        yield None
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + wait_seconds
    waited = [False]  # the wait is announced (log, test point) once, however often the lock is re-taken
    while True:
        fd, token = _open(path, step)
        try:
            if token is None:  # an existing lock file: wait for its flock, then judge what it holds
                _refuse_foreign(fd, path)
                _acquire(fd, path, wait_seconds, deadline, waited, step, busy, remedy)
                if not _still_at(fd, path):
                    continue  # released and unlinked by its holder meanwhile: lock the file there now
                found = _record(fd)
                if found is None:
                    _refuse_foreign(fd, path)
                if found:
                    # A lock record nobody holds (we hold its flock): its holder was killed. Replace it.
                    os.unlink(path)
                    continue
                # an empty file: never one of this tool's (created whole, record first); held as it is
            try:
                yield path
            finally:
                _release(fd, path, token, step)
            return
        finally:
            os.close(fd)  # releases the flock


def _release(fd: int, path: Path, token: str | None, step: str) -> None:
    """Remove the lock file, under its flock, while it is provably ours: our inode, our token."""
    if token is None or not _still_at(fd, path):
        return
    found = _record(fd)
    if found and found.get("token") == token:
        testhooks.reached(f"{step}:lock-release")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _acquire(fd: int, path: Path, wait_seconds: float, deadline: float, waited: list[bool], step: str,
             busy: str, remedy: str) -> None:
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        if not waited[0]:
            waited[0] = True
            log.info("waiting up to %g s for %s, held by %s", wait_seconds, path, _holder(fd))
            testhooks.reached(f"{step}:lock-wait")
        left = deadline - time.monotonic()
        if left <= 0:
            raise Refused(f"{busy} ({_holder(fd)}): {path} was still held after {wait_seconds:g} s "
                          "(--lock-wait-seconds); nothing was changed", path=str(path), remedy=remedy)
        time.sleep(min(POLL_SECONDS, left))


def remove_if_stale(path: Path) -> bool:
    """Remove the lock file ``path`` when it holds a lock record whose holder is gone: nobody holds its
    flock (taken here, so no request can take it meanwhile), the record names this host and its pid no
    longer runs. An empty or foreign file, a held lock, one of a live pid or another host's stays. True when removed."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held (BlockingIOError), or a file system without flock: its holder may run
            return False
        found = _record(fd)
        if not found or not _still_at(fd, path):
            return False
        pid = found.get("pid")
        # Another host's holder cannot be proven gone from here (flock may be a no-op on a shared mount).
        if str(found.get("host", "")).split(".")[0] != host_tag() or not isinstance(pid, int) or not writer_gone(pid):
            return False
        os.unlink(path)  # a lock record nobody holds, under its flock: its holder was killed
        return True
    finally:
        os.close(fd)


READING_SUFFIX = ".reading"


def held_by(path: Path) -> str | None:
    """The holder of the lock file ``path`` (``pid P on host H, started T``) while some process holds its
    flock; None when it is absent or free. Read-only: nothing is created, written or removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(fd)
        except OSError:
            return None  # a file system without flock: its holder cannot be seen this way
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def artifact_key(target: Path | str) -> Path:
    """The directory a reader mark is kept beside: ``target`` with every symlink resolved (the mark names
    the directory whose files are read, however the reader spelled it)."""
    return Path(os.path.realpath(target))


@contextlib.contextmanager
def reading(target: Path) -> Iterator[Path | None]:
    """Mark ``target`` (a directory) as read in place by this process for the block: a new, uniquely named
    file beside it holding this process's lock record, removed when the block ends. Where the mark cannot
    be created (a read-only or another user's directory, where this user could not prune either) the
    block runs unmarked (yields None). The mark is keyed by the resolved directory (``artifact_key``), so a
    reader through a symlink (``checkpoint_artifacts/best``) marks the artifact it reads."""
    target = artifact_key(target)
    mark = target.with_name(tagged_name(f".{target.name}", READING_SUFFIX))
    try:
        fd = os.open(mark, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        log.info("reading %s unmarked: cannot create %s (%s)", target, mark, exc.strerror)
        yield None
        return
    try:
        started = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        os.write(fd, (json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}) + "\n")
                 .encode("utf-8"))
    finally:
        os.close(fd)
    for dead in dead_temporaries(target.parent, [f".{target.name}"], READING_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(dead)  # a killed reader's mark (this host, its pid gone): it names nobody
    try:
        yield mark
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(mark)  # the name is this process's own (tagged with its pid and a fresh token)


def readers_of(target: Path) -> list[str]:
    """Who reads ``target`` in place now: one ``pid P on host H, started T`` per live reader mark beside it.
    A mark of another host counts (its reader may still run); one of this host whose pid is gone does not.
    ``target`` is resolved as ``reading`` resolves it: any spelling of the directory finds its readers."""
    target = artifact_key(target)
    try:
        names = sorted(os.listdir(target.parent))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        parsed = parse_tagged_name(name, READING_SUFFIX)
        if parsed is None or parsed[0] != f".{target.name}":
            continue
        _, host, pid = parsed
        if host == host_tag() and writer_gone(pid):
            continue
        try:
            record = json.loads((target.parent / name).read_text(encoding="utf-8"))
            found.append(f"pid {record['pid']} on host {record['host']}, started {record['started']}")
        except (OSError, ValueError, KeyError, TypeError):
            found.append(f"pid {pid} on host {host} (mark {target.parent / name})")
    return found
