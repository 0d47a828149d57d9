"""Snakemake invocations, and the ckptflow verbs that load torch, each a process of its own forked from a
template that has already imported the heavy third-party modules they start by importing.

A Snakemake process spends about 1.4 of its 1.6–2 CPU-s importing Snakemake and its plugins (pandas,
SQLAlchemy, smart_open, PuLP, ...) before it reads a Snakefile; a ``ckptflow merge`` or ``materialize``
spends 1.5–3 CPU-s importing torch and transformers. The suite starts a few hundred of each, and on two
cores those imports were its largest single cost. Here each pytest process starts one template per kind
(``python preloaded.py serve KIND``) that imports those modules once and freezes them out of the garbage
collector (``gc.freeze``: a child's collections would otherwise touch, and copy, every page). An invocation
is a ``fork()`` of it that sets its working directory, environment, ``sys.argv``, ``sys.path[0]`` and
standard streams, then runs ``snakemake.cli.main`` as the ``snakemake`` console script does, or the
``ckptflow`` module as ``python -m ckptflow`` does. It is a process of its own (its own pid, its jobs and
subprocesses its children, killed by a signal like any), it imports the code under test afresh (a template
imports no ckptflow module), reads its inputs afresh and leaves through the interpreter's normal exit.
What differs from a shell's start is only what was already imported, so nothing that depends on what a
process has imported uses a template: the torch-free probes, the memory ceilings, the write counts and the
racing or killed processes (``start_cli``) start their interpreter as usual; so does every call whose
environment changes a ``PYTHON*`` variable the template started under. The console scripts themselves still
run as such (the demo, the Slurm tests, ``test_snakemake.py``). ``CKPTFLOW_TEST_PRELOADED`` names the kinds
that use a template (default ``snakemake,ckptflow``; ``0`` none, so every call starts its own interpreter).

Protocol (JSON lines): the client writes ``{"id", "argv", "cwd", "env", "stdout", "stderr"}``; the template
answers ``{"id", "pid"}`` once forked and ``{"id", "status"}`` (the ``waitpid`` status) once that process
has ended.
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

# What each kind of process imports before it does anything of its own; third-party modules only.
PRELOAD = {
    "snakemake": (
        "snakemake.cli", "snakemake.api", "snakemake.workflow", "snakemake.scheduling.job_scheduler",
        "snakemake.persistence", "snakemake.report", "snakemake.report.html_reporter", "snakemake.profiles",
        "snakemake.storage", "snakemake.assets", "smart_open", "pulp", "yaml", "jsonschema", "jinja2",
        "platformdirs", "packaging.version", "argparse_dataclass", "difflib", "graphlib",
    ),
    "ckptflow": (
        "torch", "transformers", "transformers.modeling_utils", "safetensors.torch", "botocore.session",
        "jsonschema", "tqdm",
    ),
}
EXECUTOR_PREFIX = "snakemake_executor_plugin_"  # Snakemake's registry imports every installed one at start


# ------------------------------------------------------------------------------------------- template


def _preload(kind: str) -> None:
    import gc
    import importlib
    import pkgutil

    for name in PRELOAD[kind]:
        importlib.import_module(name)
    if kind == "snakemake":
        for info in pkgutil.iter_modules():
            if info.ispkg and info.name.startswith(EXECUTOR_PREFIX):
                importlib.import_module(info.name)
    gc.freeze()
    if threading.active_count() != 1:
        raise SystemExit(f"preloaded: the {kind} template runs {threading.active_count()} Python threads; "
                         "it cannot fork")


def _send(message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def _child(kind: str, request: dict, sel: selectors.BaseSelector) -> None:
    """In the forked process: becomes the requested command; never returns (the command's SystemExit, or the
    one raised here, ends the process through the interpreter's normal exit)."""
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
    argv = list(request["argv"])
    if kind == "snakemake":  # ``snakemake ARGS``: the console script's directory first on the path
        sys.argv = argv
        sys.path[0] = os.path.dirname(argv[0])
        from snakemake.cli import main

        main(argv[1:])
    else:  # ``python -m ckptflow ARGS``: the working directory first on the path
        import runpy

        sys.argv = [argv[0], *argv[3:]]
        sys.path[0] = request["cwd"]
        runpy.run_module("ckptflow", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def serve(kind: str) -> None:
    """The template: preload, then fork one process per request and report when each ended."""
    _preload(kind)
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
                        _child(kind, request, sel)
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
    """One template of a kind per pytest process, started on first use; a reader thread routes its answers."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.env = dict(os.environ)
        self.dir = Path(tempfile.mkdtemp(prefix=f"preloaded-{kind}-"))
        self.log = self.dir / "template.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, __file__, "serve", kind], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, cwd=self.dir)
        self.lock = threading.Condition()
        self.write_lock = threading.Lock()  # never the condition's: the reader must store answers meanwhile
        self.answers: dict[int, dict] = {}
        self.next_id = 0
        self.gone = False
        self.reader = threading.Thread(target=self._read, name=f"preloaded-{kind}-reader", daemon=True)
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

    def starts_like(self, env: dict[str, str]) -> bool:
        """Whether an interpreter started under ``env`` would start as the template did."""
        return all(env.get(k) == self.env.get(k) for k in {*env, *self.env} if k.startswith("PYTHON"))

    def _wait_for(self, rid: int, field: str, timeout: float | None) -> dict | None:
        with self.lock:
            ok = self.lock.wait_for(lambda: field in self.answers.get(rid, {}) or self.gone, timeout)
            if ok and field not in self.answers.get(rid, {}):
                raise RuntimeError(f"the {self.kind} template process ended (exit {self.proc.poll()}); "
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


_templates: dict[str, _Template] = {}
_templates_lock = threading.Lock()


def _template(kind: str) -> _Template:
    with _templates_lock:
        template = _templates.get(kind)
        if template is None or template.gone:
            template = _templates[kind] = _Template(kind)
            import atexit

            atexit.register(template.close)
        return template


def _enabled(kind: str) -> bool:
    """``CKPTFLOW_TEST_PRELOADED``: the kinds that fork from a template, comma-separated (default: all)."""
    kinds = os.environ.get("CKPTFLOW_TEST_PRELOADED", ",".join(PRELOAD))
    return kind in {k.strip() for k in kinds.split(",")}


def _installed(kind: str) -> bool:
    """Whether every top-level package the kind preloads is installed (nothing is imported to tell)."""
    import importlib.util

    return all(importlib.util.find_spec(name.partition(".")[0]) is not None for name in PRELOAD[kind])


def _exec(argv: list[str], cwd: str | None, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def snakemake(argv: list[str], *, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)`` for a Snakemake
    command line (``argv[0]`` the console script), forked from this process's Snakemake template."""
    if not _enabled("snakemake"):
        return _exec(argv, None, env, timeout)
    template = _template("snakemake")
    if not template.starts_like(env):
        return _exec(argv, None, env, timeout)
    return template.run(argv, os.getcwd(), env, timeout)


def ckptflow(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """The same for ``[sys.executable, "-m", "ckptflow", ...]``, forked from the ckptflow template (torch and
    transformers imported)."""
    if argv[:3] != [sys.executable, "-m", "ckptflow"]:
        raise ValueError(f"not a python -m ckptflow command line: {argv[:3]}")
    if not _enabled("ckptflow") or not _installed("ckptflow"):
        return _exec(argv, str(cwd), env, timeout)  # a core-only install (the core legs) has no torch to preload
    template = _template("ckptflow")
    if not template.starts_like(env):
        return _exec(argv, str(cwd), env, timeout)
    return template.run(argv, str(cwd), env, timeout)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve" or sys.argv[2] not in PRELOAD:
        raise SystemExit(f"usage: preloaded.py serve {{{','.join(PRELOAD)}}}  (started by the tests)")
    serve(sys.argv[2])
