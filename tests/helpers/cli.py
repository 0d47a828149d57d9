"""The real ``python -m ckptflow`` in a subprocess, run from the checkout."""

from __future__ import annotations

import fcntl
import json
import os
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable
from pathlib import Path

from . import REPO, preloaded

# run_cli, start_cli and run_on_terminal fork every verb from a template that imported its third-party
# modules once (tests/helpers/preloaded.py): the verbs that load torch and transformers from the ``ckptflow``
# template, the others from ``ckptflow-core``, which imports none of the extras. The probes of what a
# process imports, writes or holds in memory start their own interpreter.
TORCH_VERBS = frozenset({"merge", "materialize"})


def _kind(args: tuple[str, ...]) -> str:
    return "ckptflow" if args and args[0] in TORCH_VERBS else "ckptflow-core"


def _env(env: dict | None) -> dict[str, str]:
    return {**os.environ, "CKPTFLOW_PROGRESS": "0", **(env or {})}


def run_cli(*args: str, env: dict | None = None, timeout: float = 300, json_report: bool = True) -> subprocess.CompletedProcess:
    """Run one verb to completion; when stdout is not empty it must be exactly one JSON report
    (parsed into ``.report``, else ``.report`` is None), unless ``json_report=False`` (``--help``).
    ``env`` is added to the current environment."""
    argv = [sys.executable, "-m", "ckptflow", *args]
    proc = preloaded.ckptflow(argv, cwd=REPO, env=_env(env), timeout=timeout, kind=_kind(args))
    proc.report = json.loads(proc.stdout) if json_report and proc.stdout.strip() else None  # type: ignore[attr-defined]
    if proc.report is not None:
        assert proc.stdout.count("\n") == 1, proc.stdout
    return proc


# Runs the verb in this interpreter and, at exit, tells on stderr how many bytes the whole process passed
# to write calls (``wchar`` of ``/proc/self/io``, every thread counted): files, pipes and terminals alike.
_COUNTING_WRITES = (
    "import atexit, os, runpy, sys\n"
    "def told():\n"
    "    with open('/proc/self/io') as fh:\n"
    "        io = dict(line.split(': ') for line in fh.read().splitlines())\n"
    "    os.write(2, ('\\n%s %s\\n' % ('bytes-written', io['wchar'])).encode())\n"
    "atexit.register(told)\n"
    "sys.argv[0] = 'ckptflow'\n"
    "runpy.run_module('ckptflow', run_name='__main__')\n"
)


def run_cli_counting_writes(*args: str, env: dict | None = None, timeout: float = 300) -> tuple[subprocess.CompletedProcess, int]:
    """``run_cli``, and the bytes the process wrote in all (stdout and stderr included): a verb that must
    write nothing to disk is held to a few KiB of report and log."""
    proc = subprocess.run([sys.executable, "-c", _COUNTING_WRITES, *args], capture_output=True, text=True,
                          env=_env(env), timeout=timeout, cwd=REPO)
    proc.report = json.loads(proc.stdout) if proc.stdout.strip() else None  # type: ignore[attr-defined]
    told = [line for line in proc.stderr.splitlines() if line.startswith("bytes-written ")]
    assert told, proc.stderr[-3000:]
    return proc, int(told[-1].split()[1])


def start_cli(*args: str, env: dict | None = None) -> subprocess.Popen | preloaded.Started:
    """Start one verb in the background (for pause points, races and SIGKILL); stdout and stderr captured,
    as text. A forked verb is a ``preloaded.Started``, used as the ``subprocess.Popen`` of one that started
    its own interpreter."""
    argv = [sys.executable, "-m", "ckptflow", *args]
    return preloaded.start_ckptflow(argv, cwd=REPO, env=_env(env), kind=_kind(args))


def wait_until(check: Callable[[], bool], proc: subprocess.Popen, what: str, timeout: float = 120,
               detail: Callable[[], str] | None = None) -> None:
    """Wait until ``check()`` holds while ``proc`` runs; fail when it exited first (``detail()``, e.g. its
    stderr, goes into the message) or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None or check(), \
            f"the process exited ({proc.returncode}) before {what}{f': {detail()}' if detail else ''}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until a paused process has written its pause file (fail early if it exited instead)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before pausing: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"process did not reach its pause point within {timeout} s")
        time.sleep(0.05)


def take_turns_at_a_lock(args: tuple[str, ...], holding_at: str, lock_wait_at: str, tmp_path: Path):
    """Two runs of the same verb and arguments: the first pauses at ``holding_at`` (its lock held), the
    second is started and pauses at ``lock_wait_at`` (waiting for that lock, its holder named); then both
    are let go. Returns ``(first, out, err, second, out2, err2)`` once both have exited."""
    flag, waiting = tmp_path / "paused", tmp_path / "waiting"
    first = start_cli(*args, env={"CKPTFLOW_TEST_PAUSE_AT": holding_at, "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    wait_for_file(flag, first)
    second = start_cli(*args, env={"CKPTFLOW_TEST_PAUSE_AT": lock_wait_at, "CKPTFLOW_TEST_PAUSE_FILE": str(waiting)})
    wait_for_file(waiting, second)
    waiting.unlink()
    flag.unlink()
    out, err = first.communicate(timeout=120)
    out2, err2 = second.communicate(timeout=120)
    return first, out, err, second, out2, err2


def run_on_terminal(*args: str, env: dict | None = None, timeout: float = 300,
                    stderr_terminal: bool = False, columns: int | None = None,
                    cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run one verb with stdout on a pseudo-terminal (the child sees ``isatty()``), stderr on a pipe, or
    on the same terminal with ``stderr_terminal`` (then ``.stderr`` is empty and ``.stdout`` holds both).
    The terminal does not turn ``\\n`` into ``\\r\\n``, so ``.stdout`` is byte for byte what was written.
    ``columns`` sets the terminal's window size (and drops ``COLUMNS``/``LINES`` from the environment, so
    the child reads the size from the terminal, as it would in a real one). ``cwd``: the working directory
    (default: the checkout)."""
    master, slave = os.openpty()
    child_env = _env(env)
    if columns is not None:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
        for name in ("COLUMNS", "LINES"):
            child_env.pop(name, None)
    attrs = termios.tcgetattr(slave)
    attrs[1] &= ~termios.ONLCR
    termios.tcsetattr(slave, termios.TCSANOW, attrs)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every holder of the terminal's other end closed it
                return
            if not data:
                return
            chunks.append(data)

    err_read, err_write = (-1, -1) if stderr_terminal else os.pipe()
    errors: list[bytes] = []

    def drain_errors() -> None:
        while data := os.read(err_read, 65536):
            errors.append(data)

    readers = [threading.Thread(target=drain, daemon=True)]
    if not stderr_terminal:
        readers.append(threading.Thread(target=drain_errors, daemon=True))
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        argv = [sys.executable, "-m", "ckptflow", *args]
        proc = preloaded.start_ckptflow_attached(argv, cwd=cwd or REPO, env=child_env, stdin=null, stdout=slave,
                                                 stderr=slave if stderr_terminal else err_write, kind=_kind(args))
        for fd in (slave, err_write):  # the verb holds them now; its end is their end
            if fd != -1:
                os.close(fd)
        slave = err_write = -1
        for reader in readers:
            reader.start()
        try:
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for reader in readers:
            reader.join(timeout)
    finally:
        for fd in (slave, err_write, err_read, null):
            if fd != -1:
                os.close(fd)
        os.close(master)
    return subprocess.CompletedProcess(argv, proc.returncode, b"".join(chunks).decode(), b"".join(errors).decode())


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[str, str]:
    """Wait for a started verb and return its (stdout, stderr); kill it if it outlives ``timeout``."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
