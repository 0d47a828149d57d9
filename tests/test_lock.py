"""The lock files' own rules (src/ckptflow/lock.py): what a request may remove without taking the lock."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys

from ckptflow.lock import remove_if_stale


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _lock_record(path, host: str, pid: int) -> None:
    path.write_text(json.dumps({"pid": pid, "host": host, "started": "2026-12-03T00:00:00Z", "token": "0" * 32}) + "\n")


def test_a_lock_record_of_a_dead_pid_on_this_host_is_removed(tmp_path):
    lock = tmp_path / "iter_000100.restore.lock"
    _lock_record(lock, socket.gethostname(), _dead_pid())
    assert remove_if_stale(lock)
    assert not lock.exists()


def test_a_lock_record_of_another_host_stays_because_its_holder_cannot_be_proven_gone(tmp_path):
    lock = tmp_path / "iter_000100.restore.lock"
    _lock_record(lock, "another-node-17", _dead_pid())
    before = lock.read_bytes()
    assert not remove_if_stale(lock)
    assert lock.read_bytes() == before


def test_a_held_lock_an_empty_file_and_a_live_holder_stay(tmp_path):
    held = tmp_path / "held.lock"
    _lock_record(held, socket.gethostname(), _dead_pid())
    fd = os.open(held, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert not remove_if_stale(held)
    finally:
        os.close(fd)
    empty = tmp_path / "empty.lock"
    empty.touch()
    live = tmp_path / "live.lock"
    _lock_record(live, socket.gethostname(), os.getpid())
    assert not remove_if_stale(empty) and not remove_if_stale(live)
    assert held.exists() and empty.exists() and live.exists()
