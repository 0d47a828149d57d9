"""Starting a job and killing it whole: ``run_job(argv, env)`` starts it in a session of its own and, waited
for, kills whatever is left of it after its timeout; ``kill_job(proc)`` SIGKILLs every process it started (found from
/proc by parent pid, wherever their session), then its own process group. ``torchrun`` (torch 2.13) starts
its workers in a session of their own, so killing the launcher's process group alone leaves them training."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, parents before their children."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, ...
        except OSError:
            continue  # it ended meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_marked(name: str, value: str) -> list[int]:
    """SIGKILL every process of this user whose environment holds ``name=value`` (a value unique to one
    test, such as a path under its temporary directory), and its descendants; returns their pids. For the
    processes of a Slurm job that the test cluster's process tracking (``proctrack/linuxproc``: by parent
    pid) loses once their parent has exited: a cancelled job's step left that way went on running after its
    test, and after the suite."""
    marker = f"{name}={value}".encode()
    killed = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        pid = int(environ.parent.name)
        if pid == os.getpid():
            continue
        try:
            if marker not in environ.read_bytes().split(b"\0"):
                continue
        except OSError:
            continue  # it ended meanwhile, or is not ours
        killed += _sigkill([p for p in [pid, *descendants(pid)] if p not in killed])
    return killed


def _sigkill(pids: list[int]) -> list[int]:
    """SIGKILL each of ``pids``; returns those that were still there."""
    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def kill_job(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``, every process it started and its process group (it was started with
    ``start_new_session=True``)."""
    _sigkill([proc.pid, *descendants(proc.pid)])
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_job(argv: list[str], *, cwd: Path, env: dict[str, str], wait: bool = True, timeout: float = 600,
            preloaded: str | None = None) -> subprocess.Popen | subprocess.CompletedProcess:
    """``argv`` in its own session (its process group, torchrun's workers with it), output captured. With
    ``wait``, its completed process, the whole job killed (``kill_job``) if it outlives ``timeout``;
    without, the running ``Popen`` (pause points, SIGKILL). ``preloaded``: a ``python SCRIPT`` command line
    forked from that kind of template (preloaded.py: ``hf`` for the Hugging Face examples on one process),
    where the kind forks; a ``Started``, handled as the ``Popen``."""
    proc = None
    if preloaded is not None:
        from .preloaded import start_script

        proc = start_script(argv, cwd=cwd, env=env, kind=preloaded)
    if proc is None:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
    if not wait:
        return proc
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            kill_job(proc)  # torchrun's workers too: they run in a session of their own
            proc.communicate()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)
