"""Snakemake invocations for the workflow tests, each a process of its own forked from a template that has
already imported Snakemake.

A Snakemake process spends about 1.4 of its 1.6–2 CPU-s importing Snakemake and its plugins (pandas,
SQLAlchemy, smart_open, PuLP, ...) before it reads a Snakefile, and the workflow tests start a few hundred:
on the suite's two cores that import was its largest single cost. Here each pytest process starts one
template (``python snakemake_fork.py serve``) that imports those modules once; an invocation is a ``fork()``
of it that sets its working directory, environment, ``sys.argv`` and standard streams and then runs
``snakemake.cli.main`` like the ``snakemake`` console script does. It is a process of its own (its own pid,
its jobs its children, killed by a signal like any), it reads the Snakefile and the configuration afresh
and exits through the interpreter's normal exit, so it behaves as ``snakemake`` started from a shell would.
The template imports no ckptflow module (nothing of the code under test is loaded before the fork) and
runs no thread (it forks).

The console script itself is still run as such: the demo, the Slurm tests, ``test_snakemake.py`` and the
receipt race in ``test_records.py`` start ``.venv/bin/snakemake``; ``CKPTFLOW_TEST_SNAKEMAKE=exec`` makes
every workflow test do so.

Protocol (JSON lines): the client writes ``{"id", "argv", "cwd", "env", "stdout", "stderr"}``; the template
answers ``{"id", "pid"}`` once forked and ``{"id", "status"}`` (the ``waitpid`` status) once that process has
ended.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# What a Snakemake run imports before it reads the Snakefile, in the order it does; third-party only.
PRELOAD = (
    "snakemake.cli", "snakemake.api", "snakemake.workflow", "snakemake.scheduling.job_scheduler",
    "snakemake.persistence", "snakemake.report", "snakemake.report.html_reporter", "snakemake.profiles",
    "snakemake.storage", "snakemake.assets", "smart_open", "pulp", "yaml", "jsonschema", "jinja2",
    "platformdirs", "packaging.version", "argparse_dataclass", "difflib", "graphlib",
)
EXECUTOR_PREFIX = "snakemake_executor_plugin_"


# ------------------------------------------------------------------------------------------- template


def _preload() -> None:
    import importlib
    import pkgutil

    for name in PRELOAD:
        importlib.import_module(name)
    for info in pkgutil.iter_modules():  # the executor plugins Snakemake's registry imports at start
        if info.ispkg and info.name.startswith(EXECUTOR_PREFIX):
            importlib.import_module(info.name)
    import gc

    gc.freeze()  # what is loaded now stays out of every child's collections (they would touch every page)
    if threading.active_count() != 1:
        raise SystemExit(f"snakemake_fork: the template runs {threading.active_count()} threads; it cannot fork")


def _send(message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def _child(request: dict, sel: selectors.BaseSelector) -> None:
    """In the forked process: becomes ``snakemake ARGV`` run from ``cwd`` with ``env``; never returns (the
    SystemExit of Snakemake's main ends the process through the interpreter's normal exit)."""
    for key in list(sel.get_map().values()):
        if key.fileobj != 0:
            os.close(key.fileobj)
    sel.close()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.dup2(out, fd)
        os.close(out)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    from snakemake.cli import main

    main(sys.argv[1:])
    raise SystemExit(0)


def serve() -> None:
    """The template: preload, then fork one process per request and report when each ended."""
    _preload()
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    pending = b""
    while True:
        for key, _ in sel.select():
            if key.fileobj == 0:
                chunk = os.read(0, 1 << 16)
                if not chunk:
                    return  # the client is gone; running invocations finish on their own
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    request = json.loads(line)
                    pid = os.fork()
                    if pid == 0:
                        _child(request, sel)
                    sel.register(os.pidfd_open(pid), selectors.EVENT_READ, (request["id"], pid))
                    _send({"id": request["id"], "pid": pid})
            else:
                rid, pid = key.data
                _, status = os.waitpid(pid, 0)
                sel.unregister(key.fileobj)
                os.close(key.fileobj)
                _send({"id": rid, "status": status})


# --------------------------------------------------------------------------------------------- client


class _Template:
    """One template per pytest process, started on first use; a reader thread routes its answers."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="snakemake-fork-"))
        self.log = self.dir / "template.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, __file__, "serve"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, cwd=self.dir)
        self.lock = threading.Condition()
        self.write_lock = threading.Lock()  # never the condition's: the reader must store answers meanwhile
        self.answers: dict[int, dict] = {}
        self.next_id = 0
        self.gone = False
        self.reader = threading.Thread(target=self._read, name="snakemake-fork-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            message = json.loads(line)
            with self.lock:
                self.answers.setdefault(message["id"], {}).update(message)
                self.lock.notify_all()
        with self.lock:
            self.gone = True
            self.lock.notify_all()

    def _wait_for(self, rid: int, field: str, timeout: float | None) -> dict | None:
        with self.lock:
            ok = self.lock.wait_for(lambda: field in self.answers.get(rid, {}) or self.gone, timeout)
            if ok and field not in self.answers.get(rid, {}):
                raise RuntimeError(f"the Snakemake template process ended (exit {self.proc.poll()}); "
                                   f"its log: {self.log}\n{self.log.read_text(errors='replace')[-4000:]}")
            return self.answers[rid] if ok else None

    def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
        with self.lock:
            rid = self.next_id
            self.next_id += 1
        work = Path(tempfile.mkdtemp(prefix=f"run{rid}-", dir=self.dir))
        out, err = work / "stdout", work / "stderr"
        request = {"id": rid, "argv": argv, "cwd": cwd, "env": env, "stdout": str(out), "stderr": str(err)}
        with self.write_lock:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        pid = self._wait_for(rid, "pid", 120)["pid"]
        done = self._wait_for(rid, "status", timeout)
        if done is None:
            os.kill(pid, 9)
            self._wait_for(rid, "status", 60)
            raise subprocess.TimeoutExpired(argv, timeout, _read(out), _read(err))
        with self.lock:
            del self.answers[rid]
        result = subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(done["status"]), _read(out), _read(err))
        for path in (out, err):
            path.unlink()
        work.rmdir()
        return result

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.reader.join(timeout=60)
        self.proc.stdout.close()


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", "replace") if path.exists() else ""


_template: _Template | None = None
_template_lock = threading.Lock()


def run(argv: list[str], *, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)`` for a Snakemake
    command line (``argv[0]`` the console script), forked from this process's template."""
    global _template
    if os.environ.get("CKPTFLOW_TEST_SNAKEMAKE") == "exec":
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    with _template_lock:
        if _template is None or _template.gone:
            _template = _Template()
            import atexit

            atexit.register(_template.close)
    return _template.run(argv, os.getcwd(), env, timeout)


if __name__ == "__main__":
    if sys.argv[1:] != ["serve"]:
        raise SystemExit("usage: snakemake_fork.py serve  (started by the tests, one per pytest process)")
    serve()
