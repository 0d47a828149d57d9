"""Snakemake invocations and ckptflow verbs, each a process of its own forked from a template that has
already imported the third-party modules they start by importing.

A Snakemake process spends about 1.4 of its 1.6–2 CPU-s importing Snakemake and its plugins (pandas,
SQLAlchemy, smart_open, PuLP, ...) before it reads a Snakefile; a ``ckptflow merge`` or ``materialize``
spends 1.5–3 CPU-s importing torch and transformers, any other verb 0.2–0.4 CPU-s importing botocore and
jsonschema. The suite starts hundreds of each, and on two cores those imports were its largest single cost.
Here each pytest process starts one template per kind (``python preloaded.py serve KIND``): ``snakemake``,
``ckptflow`` (torch and transformers: merge, materialize), ``ckptflow-core`` (no module of the
[convert] or [workflow] extras: every other verb) and ``hf`` (torch, transformers, accelerate, datasets,
PEFT and TRL: the Hugging Face examples run on one process, 7–8 CPU-s of imports each, started as jobs of
their own by ``procs.run_job``: ``start_script``, in a session of their own). A template imports those modules once and freezes them
out of the garbage collector (``gc.freeze``: a child's collections would otherwise touch, and copy, every
page). An invocation is a ``fork()`` of it that sets its working directory, environment, ``sys.argv``,
``sys.path[0]`` and standard streams, then runs ``snakemake.cli.main`` as the ``snakemake`` console script
does, or the ``ckptflow`` module as ``python -m ckptflow`` does. It is a process of its own (its own pid,
its jobs and subprocesses its children, killed by a signal like any), it reads its inputs afresh and leaves
through the interpreter's normal exit. A template also imports the checkout's own modules its processes
start by importing (``OWN`` less ``PER_PROCESS``: none reads the environment or computes a value of its
own process at import) and parses botocore's S3 data once (what ``ckptflow.store.s3.new_session`` keeps
for a process anyway). What differs from a shell's start is only what was already imported (and parsed),
so nothing that depends on what a process has imported uses a template: the torch-free probes, the memory
ceilings and the write counts start their interpreter as usual; so does every call whose environment changes a ``PYTHON*``
variable the template started under, and every kind whose modules are not installed (the core legs have
no torch and no Snakemake; their verbs fork from ``ckptflow-core``). A verb started in the background
(``start_cli``: pause points, races, SIGKILL) is a fork too, handled through ``Started`` as a
``subprocess.Popen``; its output goes to files, not pipes. A verb on a pseudo-terminal (``run_on_terminal``)
is a fork too, given the terminal itself (``Attached``). The script jobs of a forked Snakemake (every
workflow step) fork from the ckptflow templates: the ``python`` that Snakemake runs them with is a small
launcher that hands the job's streams, directory and environment to a template and stands for the job
(job_launcher.py). The console scripts themselves still run as such (the demo, the Slurm tests,
``test_snakemake.py``), and so do their jobs. ``CKPTFLOW_TEST_PRELOADED`` names the kinds that use a
template, and ``snakemake-jobs`` where a forked Snakemake's jobs fork too (default: the three kinds and
``snakemake-jobs``; ``0``: none, so every call starts its own interpreter).

Protocol (JSON lines). On the template's standard input the client writes ``{"id", "argv", "cwd", "env",
"stdout", "stderr"}`` (the output files' paths); the template answers ``{"id", "pid"}`` once forked and
``{"id", "status"}`` (the ``waitpid`` status) once that process has ended. On a ckptflow template's
``jobs.sock`` (a Unix socket in its directory) a launcher sends ``{"argv", "cwd", "env"}`` with its
standard input, output and error as descriptors, and is answered ``{"pid"}`` then ``{"status"}`` on the
same connection.
"""

from __future__ import annotations

import functools
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# What each kind of process imports before it does anything of its own; third-party modules only.
PRELOAD = {
    "snakemake": (
        "snakemake.cli", "snakemake.api", "snakemake.workflow", "snakemake.scheduling.job_scheduler",
        "snakemake.persistence", "snakemake.report", "snakemake.report.html_reporter", "snakemake.profiles",
        "snakemake.storage", "snakemake.assets", "smart_open", "pulp", "yaml", "jsonschema", "jinja2",
        "platformdirs", "packaging.version", "argparse_dataclass", "difflib", "graphlib",
    ),
    "ckptflow": (  # merge, materialize
        "torch", "transformers", "transformers.modeling_utils", "safetensors.torch", "botocore.session",
        "jsonschema", "tqdm",
    ),
    "ckptflow-core": (  # every other verb: nothing of the [convert] or [workflow] extras
        "botocore.session", "botocore.client", "urllib3", "jsonschema", "tqdm", "argparse", "logging",
        "http.client", "concurrent.futures",
    ),
    "hf": (  # the Hugging Face examples (examples/train_hf_trainer.py, train_trl_sft.py) on one process
        "torch", "torch.distributed", "transformers", "transformers.trainer", "transformers.modeling_utils",
        "safetensors.torch", "accelerate", "datasets", "peft", "trl", "botocore.session", "jsonschema", "tqdm",
        "torch.distributed.run",  # a torchrun's agent (``torchrun``)
    ),
}
# The checkout's own modules each kind's processes import ("P.*": package P and each module in it): the CLI,
# the verbs and the steps under them, the workflow's planning and scripts; the torch-side steps and the
# trainer API where the kind has torch. None needs an extra the kind lacks, and none (``PER_PROCESS`` left
# out) reads the environment or computes a value of its own process at import (tests/test_preloaded.py), so
# a fork runs them as a fresh import in its own process and environment would.
_CORE_OWN = ("ckptflow.cli", "ckptflow.commands.*", "ckptflow.archive.*", "ckptflow.store.*", "ckptflow.records.*",
             "ckptflow.status.*", "ckptflow.workflow.*")
# What a process computes for itself as it imports (the planning process's id and start time, in
# ``batches``), and the modules that import it: never imported by a template.
PER_PROCESS = ("ckptflow.workflow.batches", "ckptflow.workflow.batch_jobs", "ckptflow.workflow.plan")
OWN = {
    "snakemake": _CORE_OWN,
    "ckptflow": (*_CORE_OWN, "ckptflow.merge.*", "ckptflow.materialize.*", "ckptflow.conversion.*"),
    "ckptflow-core": _CORE_OWN,
    "hf": (*_CORE_OWN, "ckptflow.trainer.*"),
}
CKPTFLOW_KINDS = ("ckptflow", "ckptflow-core")
LISTENING_KINDS = (*CKPTFLOW_KINDS, "hf")  # the kinds whose template forks jobs a launcher hands it (jobs.sock)
TORCH_SCRIPTS = ("merge.py", "materialize.py")  # the workflow's scripts whose jobs fork from ``ckptflow``
JOBS_SOCKET = "jobs.sock"  # in a ckptflow template's directory: its script jobs' launchers connect here
READY = -1  # the id of the template's first message: preloaded (and listening for script jobs)
EXECUTOR_PREFIX = "snakemake_executor_plugin_"  # Snakemake's registry imports every installed one at start


# ------------------------------------------------------------------------------------------- template


def _import(kind: str) -> None:
    import_third_party(kind)
    import_own(kind)
    _parse_s3_data()


def import_third_party(kind: str) -> None:
    """The third-party modules of ``kind`` (``PRELOAD``; for Snakemake, every installed executor plugin too)."""
    import importlib
    import pkgutil

    for name in PRELOAD[kind]:
        importlib.import_module(name)
    if kind == "snakemake":
        for info in pkgutil.iter_modules():
            if info.ispkg and info.name.startswith(EXECUTOR_PREFIX):
                importlib.import_module(info.name)


def import_own(kind: str) -> None:
    """The checkout's modules of ``kind`` (``OWN``), but none of ``PER_PROCESS``."""
    import importlib
    import pkgutil

    for name in OWN[kind]:
        package = importlib.import_module(name.removesuffix(".*"))
        if name.endswith(".*"):
            for info in pkgutil.iter_modules(package.__path__):
                if f"{package.__name__}.{info.name}" not in PER_PROCESS:
                    importlib.import_module(f"{package.__name__}.{info.name}")


def _parse_s3_data() -> None:
    """botocore's S3 data (service model, endpoint rules, partitions) parsed once, here: ``new_session``
    keeps one data loader per process and ``AWS_DATA_PATH``, and a fresh one parses about 0.1 CPU-s of JSON
    at the first store a process opens, which nearly every forked process does. No request is made and no
    credential is looked up (the client, given keys and a region, is dropped); a process started under
    another ``AWS_DATA_PATH`` gets a loader of its own, as it would anyway."""
    from ckptflow.store.s3 import new_session

    new_session().create_client("s3", region_name="us-east-1", aws_access_key_id="preloaded",
                                aws_secret_access_key="preloaded")


def _preload(kind: str) -> None:
    import gc

    _import(kind)
    gc.freeze()
    if threading.active_count() != 1:
        raise SystemExit(f"preloaded: the {kind} template runs {threading.active_count()} Python threads; "
                         "it cannot fork")


def _send(message: dict) -> None:
    data = (json.dumps(message) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


def _child(kind: str, request: dict, sel: selectors.BaseSelector, sockets: list[socket.socket],
           fds: list[int] | None = None) -> None:
    """In the forked process: becomes the requested command; never returns (the command's SystemExit, or the
    one raised here, ends the process through the interpreter's normal exit). ``fds``: a script job's
    standard streams, handed over by its launcher (job_launcher.py); otherwise the request names files."""
    if request.get("session"):  # a job of its own (procs.run_job): its own session and process group
        os.setsid()
    for sock in sockets:
        sock.close()
    for key in list(sel.get_map().values()):
        if key.data and key.data[0] == "ended":  # the other processes' pidfds
            os.close(key.fileobj)
    sel.close()
    if fds:
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
    else:
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
        if request.get("executable"):  # what its script jobs run as ``python``
            sys.executable = request["executable"]
        from snakemake.cli import main

        main(argv[1:])
    elif argv[1] == "-c":  # ``python -c CODE ARGS``: the working directory first on the path
        sys.argv = argv[1:2] + argv[3:]
        sys.path[0] = ""
        _threads_as_started()
        exec(compile(argv[2], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    elif argv[1:3] != ["-m", "ckptflow"]:  # ``python [-u] SCRIPT``, a Snakemake script job or a torchrun
        if argv[1] == "-u":  # worker (tests/helpers/job_launcher.py): unbuffered output, as ``-u`` makes it
            argv = argv[:1] + argv[2:]
            for stream in (sys.stdout, sys.stderr):
                stream.reconfigure(write_through=True)
        sys.argv = argv[1:]
        sys.path[0] = os.path.dirname(os.path.realpath(argv[1]))
        _threads_as_started()
        import runpy

        runpy.run_path(os.path.abspath(argv[1]), run_name="__main__")
    else:  # ``python -m ckptflow ARGS`` (either ckptflow kind): the working directory first on the path
        import runpy

        sys.argv = [argv[0], *argv[3:]]
        sys.path[0] = request["cwd"]
        _threads_as_started()
        runpy.run_module("ckptflow", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def _threads_as_started() -> None:
    """torch's thread count as an interpreter started under this environment would have it: OpenMP reads
    ``OMP_NUM_THREADS`` when torch loads, in the template (Snakemake sets it to a job's threads)."""
    torch = sys.modules.get("torch")
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _receive_job(conn: socket.socket) -> tuple[dict, list[int]]:
    """A launcher's request (one JSON line) and the descriptors sent with it."""
    conn.settimeout(30)
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, more, _flags, _address = socket.recv_fds(conn, 1 << 20, 3)
        fds += more
        if not chunk:
            raise ConnectionError("a job launcher closed its connection before its request ended")
        data += chunk
    if len(fds) != 3:
        raise ConnectionError(f"a job launcher sent {len(fds)} descriptors, not its three standard streams")
    return json.loads(data), fds


def serve(kind: str) -> None:
    """The template: preload, then fork one process per request and report when each ended. Requests come
    from the pytest process on standard input and, for the ckptflow kinds, on ``jobs.sock`` in the working
    directory with the streams as descriptors (a Snakemake script job's launcher, an ``Attached`` verb); a
    connection that closes before its process ended means the one that asked was killed, and so is the
    process."""
    _preload(kind)
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    sockets: list[socket.socket] = []
    launchers: dict[int, socket.socket] = {}  # job pid -> its launcher's connection
    if kind in LISTENING_KINDS:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(JOBS_SOCKET)
        listener.listen(64)
        sockets.append(listener)
        sel.register(listener.fileno(), selectors.EVENT_READ, ("listen",))
    _send({"id": READY, "ready": True})
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
                        _child(kind, request, sel, [*sockets, *launchers.values()])
                    sel.register(os.pidfd_open(pid), selectors.EVENT_READ, ("ended", request["id"], pid))
                    _send({"id": request["id"], "pid": pid})
            elif key.data[0] == "listen":
                conn, _ = sockets[0].accept()
                try:
                    request, fds = _receive_job(conn)
                except (OSError, ValueError) as error:
                    os.write(2, f"preloaded: a job request failed: {error}\n".encode())
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    _child(kind, request, sel, [*sockets, *launchers.values(), conn], fds)
                for fd in fds:
                    os.close(fd)
                conn.settimeout(None)
                conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
                launchers[pid] = conn
                sel.register(os.pidfd_open(pid), selectors.EVENT_READ, ("ended", None, pid))
                sel.register(conn.fileno(), selectors.EVENT_READ, ("launcher", pid))
            elif key.data[0] == "launcher":  # the launcher's end of the connection closed: it was killed
                pid = key.data[1]
                if pid not in launchers:  # its job ended in this same round and was reported
                    continue
                sel.unregister(key.fileobj)
                launchers.pop(pid).close()
                os.kill(pid, signal.SIGKILL)  # not reaped yet: its pidfd's event unregisters this one
            else:
                _, rid, pid = key.data
                _, status = os.waitpid(pid, 0)
                sel.unregister(key.fileobj)
                os.close(key.fileobj)
                if rid is not None:
                    _send({"id": rid, "status": status})
                elif pid in launchers:
                    conn = launchers.pop(pid)
                    sel.unregister(conn.fileno())
                    try:
                        conn.sendall((json.dumps({"status": status}) + "\n").encode())
                    except OSError:
                        pass  # the launcher died meanwhile; it has nobody to report to
                    conn.close()


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

    @property
    def jobs(self) -> str:
        """The socket a ckptflow template listens on for Snakemake script jobs (job_launcher.py)."""
        return str(self.dir / JOBS_SOCKET)

    def ready(self) -> None:
        """Waits until the template has imported its modules (and listens for script jobs)."""
        self._wait_for(READY, "ready", 300)

    def starts_like(self, env: dict[str, str]) -> bool:
        """Whether an interpreter started under ``env`` would start as the template did (``PYTHON_EXEC``, the
        interpreter a torchrun starts its workers with, is torch's, not the interpreter's)."""
        return all(env.get(k) == self.env.get(k) for k in {*env, *self.env}
                   if k.startswith("PYTHON") and k != "PYTHON_EXEC")

    def _wait_for(self, rid: int, field: str, timeout: float | None) -> dict | None:
        with self.lock:
            ok = self.lock.wait_for(lambda: field in self.answers.get(rid, {}) or self.gone, timeout)
            if ok and field not in self.answers.get(rid, {}):
                raise RuntimeError(f"the {self.kind} template process ended (exit {self.proc.poll()}); "
                                   f"its log: {self.log}\n{self.log.read_text(errors='replace')[-4000:]}")
            return self.answers[rid] if ok else None

    def start(self, argv: list[str], cwd: str, env: dict[str, str], executable: str | None = None,
              session: bool = False) -> Started:
        with self.lock:
            rid = self.next_id
            self.next_id += 1
        work = Path(tempfile.mkdtemp(prefix=f"run{rid}-", dir=self.dir))
        out, err = work / "stdout", work / "stderr"
        request = {"id": rid, "argv": argv, "cwd": cwd, "env": env, "stdout": str(out), "stderr": str(err),
                   "executable": executable, "session": session}
        with self.write_lock:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        return Started(self, rid, argv, self._wait_for(rid, "pid", 120)["pid"], work)

    def run(self, argv: list[str], cwd: str, env: dict[str, str], timeout: float,
            executable: str | None = None) -> subprocess.CompletedProcess:
        started = self.start(argv, cwd, env, executable)
        try:
            out, err = started.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            started.kill()
            started.wait(60)
            expired.output, expired.stderr = started.stdout.read(), started.stderr.read()
            raise
        return subprocess.CompletedProcess(argv, started.returncode, out, err)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.reader.join(timeout=60)
        self.proc.stdout.close()


class _Capture:
    """A forked process's stdout or stderr: a file it writes. ``read`` gives what it has written so far;
    ``readline`` the next line, waiting for it as on a pipe (what is left once the process has ended)."""

    def __init__(self, path: Path, started: Started) -> None:
        self.path, self.started, self.offset = path, started, 0

    def read(self) -> str:
        return _read(self.path)

    def readline(self) -> str:
        while True:
            ended = self.started.poll() is not None  # before reading: then nothing written is missed
            data = self.path.read_bytes()[self.offset:] if self.path.exists() else b""
            end = data.find(b"\n") + 1 or (len(data) if ended else 0)
            if end or ended:
                self.offset += end
                return data[:end].decode("utf-8", "replace")
            time.sleep(0.02)


class Started:
    """A forked invocation still running, handled as the ``subprocess.Popen`` of a started command with
    ``stdout`` and ``stderr`` captured and text mode: ``pid``, ``args``, ``returncode``, ``poll``, ``wait``,
    ``send_signal``, ``kill``, ``terminate``, ``communicate``; ``stdout.read()`` and ``stderr.read()`` give
    what it has written so far. The template, its parent, reaps it and reports how it ended; a signal is
    sent only while that report has not come."""

    def __init__(self, template: _Template, rid: int, argv: list[str], pid: int, work: Path) -> None:
        self._template, self._rid, self._work = template, rid, work
        self.args, self.pid, self.returncode = argv, pid, None
        self.stdout, self.stderr = _Capture(work / "stdout", self), _Capture(work / "stderr", self)

    def poll(self) -> int | None:
        return self.wait(0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code (``-N`` for signal N); None only from ``poll``. Raises ``TimeoutExpired``."""
        if self.returncode is None:
            done = self._template._wait_for(self._rid, "status", timeout)
            if done is None:
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout)
            with self._template.lock:
                self._template.answers.pop(self._rid, None)
            self.returncode = os.waitstatus_to_exitcode(done["status"])
        return self.returncode

    def send_signal(self, sig: int) -> None:
        with self._template.lock:  # the reader stores the end report under this lock
            if "status" not in self._template.answers.get(self._rid, {}) and self.returncode is None:
                try:
                    os.kill(self.pid, sig)
                except ProcessLookupError:  # reaped an instant ago; its report is on its way
                    pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Waits for the end and returns ``(stdout, stderr)``, then removes the capture files."""
        self.wait(timeout)
        out, err = self.stdout.read(), self.stderr.read()
        self.stdout, self.stderr = _Done(out), _Done(err)
        for path in (self._work / "stdout", self._work / "stderr"):
            path.unlink(missing_ok=True)
        if self._work.exists():  # a second ``communicate``, as on a Popen, gives the same again
            self._work.rmdir()
        return out, err


class _Done:
    """What ``stdout``/``stderr`` read once ``communicate`` took them (its files are gone)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def read(self) -> str:
        return self.text


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
    """``CKPTFLOW_TEST_PRELOADED``: the kinds that fork from a template, comma-separated, and
    ``snakemake-jobs`` where a forked Snakemake's script jobs fork too (default: all)."""
    kinds = os.environ.get("CKPTFLOW_TEST_PRELOADED", ",".join([*PRELOAD, "snakemake-jobs"]))
    return kind in {k.strip() for k in kinds.split(",")}


@functools.cache
def _installed(kind: str) -> bool:
    """Whether every top-level package the kind preloads is installed (nothing is imported to tell)."""
    import importlib.util

    return all(importlib.util.find_spec(name.partition(".")[0]) is not None for name in PRELOAD[kind])


def _exec(argv: list[str], cwd: str | None, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def _usable(kind: str, env: dict[str, str]) -> _Template | None:
    """This process's template of ``kind``, or None where the command must start its own interpreter: the
    kind is switched off, its modules are not installed (a core-only install, the core legs, has no torch
    to preload) or ``env`` would start an interpreter differently (a ``PYTHON*`` variable)."""
    if not _enabled(kind) or not _installed(kind):
        return None
    template = _template(kind)
    return template if template.starts_like(env) else None


def snakemake(argv: list[str], *, env: dict[str, str], timeout: float = 600,
              cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)`` for a
    Snakemake command line (``argv[0]`` the console script), forked from this process's Snakemake template.
    Its script jobs fork from the ckptflow templates (``TORCH_SCRIPTS`` from ``ckptflow``, the others from
    ``ckptflow-core``) through the ``python`` it runs them with (job_launcher.py)."""
    template = _usable("snakemake", env)
    if template is None:
        return _exec(argv, None if cwd is None else str(cwd), env, timeout)
    return template.run(argv, str(cwd) if cwd is not None else os.getcwd(), env, timeout,
                        executable=_job_launcher(env))


def snakemake_planning(argv: list[str], *, cwd: str | Path, env: dict[str, str],
                       timeout: float = 300) -> subprocess.CompletedProcess:
    """``snakemake`` for a command that runs no job (a dry run, a refusal before planning) in ``cwd``:
    forked from the Snakemake template without the script jobs' launcher, so it never waits for the
    ckptflow templates to import torch."""
    template = _usable("snakemake", env)
    if template is None:
        return _exec(argv, str(cwd), env, timeout)
    return template.run(argv, str(cwd), env, timeout)


_launchers: dict[str, str] = {}


def _job_launcher(env: dict[str, str]) -> str | None:
    """The ``python`` a forked Snakemake runs its script jobs with: a file that calls job_launcher.py with
    the ckptflow templates' sockets. None where neither kind forks (every job then starts as usual)."""
    if not _enabled("snakemake-jobs"):
        return None
    sockets = {}
    for kind in CKPTFLOW_KINDS:
        template = _usable(kind, env)
        if template is not None:
            template.ready()  # else the first jobs would find no socket and start their own interpreter
        sockets[kind] = None if template is None else template.jobs
    if not any(sockets.values()):
        return None
    return _launcher("a forked Snakemake's script jobs", f"main({sockets!r}, {list(TORCH_SCRIPTS)!r}, {sys.executable!r})")


def _launcher(whose: str, call: str) -> str:
    """An executable ``python`` file (one per distinct text, kept for the session) that calls ``call`` of
    job_launcher.py in an isolated interpreter."""
    text = (f"#!{sys.executable} -IS\n"
            f"# The python of {whose} (written by {Path(__file__).name}).\n"
            f"import sys\nsys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"import job_launcher\njob_launcher.{call}\n")
    with _templates_lock:
        if text not in _launchers:
            path = Path(tempfile.mkdtemp(prefix="preloaded-launcher-")) / "python"
            path.write_text(text, encoding="utf-8")
            path.chmod(0o755)
            _launchers[text] = str(path)
        return _launchers[text]


def torchrun_env(env: dict[str, str], kind: str = "hf") -> dict[str, str]:
    """``env`` for a ``torchrun`` whose workers fork from this process's template of ``kind``: torchrun starts
    each worker as ``$PYTHON_EXEC -u SCRIPT ARGS``, and ``PYTHON_EXEC`` here is a launcher that hands the
    worker's environment, directory and streams to the template and stands for the worker (job_launcher.py:
    its exit status, signals passed on, the worker killed when the launcher is). ``env`` unchanged where
    the kind does not fork."""
    template = _usable(kind, env)
    if template is None:
        return env
    template.ready()
    return {**env, "PYTHON_EXEC": _launcher("a torchrun's workers", f"worker({template.jobs!r}, {sys.executable!r})")}


TORCHRUN = str(Path(sys.executable).with_name("torchrun"))  # the console script (a Python script)


def torchrun(args: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run([torchrun, *args], capture_output=True, text=True, ...)`` with torchrun's agent forked
    from this process's ``hf`` template as well as its workers (``torchrun_env``): an agent started as its
    own interpreter spent about 2 CPU-s importing torch before it started a worker. The agent runs the
    ``torchrun`` console script as ``python SCRIPT`` would; without a template it starts as usual."""
    env = torchrun_env(env)
    template = _usable("hf", env)
    if template is None:
        return _exec([TORCHRUN, *args], str(cwd), env, timeout)
    return template.run([sys.executable, TORCHRUN, *args], str(cwd), env, timeout)


def _check_ckptflow(argv: list[str], kind: str) -> None:
    if argv[:3] != [sys.executable, "-m", "ckptflow"]:
        raise ValueError(f"not a python -m ckptflow command line: {argv[:3]}")
    if kind not in CKPTFLOW_KINDS:
        raise ValueError(f"not a kind of ckptflow template: {kind}")


def ckptflow(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float,
             kind: str = "ckptflow") -> subprocess.CompletedProcess:
    """The same for ``[sys.executable, "-m", "ckptflow", ...]``, forked from the template of ``kind``:
    ``ckptflow`` (torch and transformers imported) or ``ckptflow-core`` (none of the extras)."""
    _check_ckptflow(argv, kind)
    template = _usable(kind, env)
    if template is None:
        return _exec(argv, str(cwd), env, timeout)
    return template.run(argv, str(cwd), env, timeout)


def start_ckptflow(argv: list[str], *, cwd: Path, env: dict[str, str],
                   kind: str = "ckptflow") -> Started | subprocess.Popen:
    """``subprocess.Popen(argv, stdout=PIPE, stderr=PIPE, text=True, env=env, cwd=cwd)`` for a ckptflow
    command line, forked from the template of ``kind``: a ``Started`` (its output in files, not pipes)."""
    _check_ckptflow(argv, kind)
    template = _usable(kind, env)
    if template is None:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                cwd=str(cwd))
    return template.start(argv, str(cwd), env)


def start_script(argv: list[str], *, cwd: Path, env: dict[str, str], kind: str = "hf") -> Started | None:
    """``python SCRIPT ARGS`` or ``python -c CODE ARGS`` (``argv[0]`` this interpreter; ``SCRIPT`` may be the
    ``torchrun`` console script, ``TORCHRUN``) forked from the template of ``kind`` in a session of its own,
    as ``subprocess.Popen(argv, ..., start_new_session=True)`` with its output captured would start it: a
    ``Started``. None where the kind does not fork (switched off, not installed, a ``PYTHON*`` variable):
    the caller starts its own interpreter then."""
    if argv[0] != sys.executable or not (argv[1].endswith(".py") or argv[1] == TORCHRUN
                                         or (argv[1] == "-c" and len(argv) > 2)):
        raise ValueError(f"not a python SCRIPT or python -c CODE command line: {argv[:2]}")
    template = _usable(kind, env)
    return None if template is None else template.start(argv, str(cwd), env, session=True)


class Attached:
    """A verb forked with standard streams the caller opened (a pseudo-terminal, a pipe), handed to the
    template over its jobs socket as a script job's launcher hands them: handled as the
    ``subprocess.Popen`` of a command started with those streams (``pid``, ``args``, ``returncode``,
    ``poll``, ``wait``, ``kill``). Closing the connection (this object collected, this process gone) while
    the verb runs makes the template kill it."""

    def __init__(self, template: _Template, argv: list[str], cwd: str, env: dict[str, str],
                 streams: tuple[int, int, int]) -> None:
        self.args, self.returncode = argv, None
        template.ready()
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(template.jobs)
        request = {"argv": argv, "cwd": cwd, "env": env}
        socket.send_fds(self._conn, [(json.dumps(request) + "\n").encode()], list(streams))
        self._pending = b""
        self.pid = json.loads(self._line(None))["pid"]
        self._pidfd = os.pidfd_open(self.pid)  # the template reaps it only after telling its status here

    def _line(self, timeout: float | None) -> bytes:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._conn], [], [], left)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout)
            chunk = self._conn.recv(1 << 16)
            if not chunk:
                raise RuntimeError(f"the template ended before {self.args[3:5]} did")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line

    def poll(self) -> int | None:
        try:
            return self.wait(0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(json.loads(self._line(timeout))["status"])
            self._conn.close()
            os.close(self._pidfd)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:  # ended an instant ago; its status is on its way
                pass


def start_ckptflow_attached(argv: list[str], *, cwd: Path, env: dict[str, str], stdin: int, stdout: int, stderr: int,
                            kind: str = "ckptflow") -> Attached | subprocess.Popen:
    """``subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=cwd)`` for a ckptflow
    command line whose streams are descriptors the caller opened, forked from the template of ``kind``."""
    _check_ckptflow(argv, kind)
    template = _usable(kind, env)
    if template is None:
        return subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env, cwd=str(cwd))
    return Attached(template, argv, str(cwd), env, (stdin, stdout, stderr))


def warm() -> None:
    """Imports every installed kind's modules once, so that their bytecode is cached before the suite's
    processes start (``make test`` runs it on a new environment: pip installs without compiling)."""
    for kind in PRELOAD:
        if _installed(kind):
            _import(kind)


if __name__ == "__main__":
    if sys.argv[1:] == ["warm"]:
        warm()
    elif len(sys.argv) != 3 or sys.argv[1] != "serve" or sys.argv[2] not in PRELOAD:
        raise SystemExit(f"usage: preloaded.py serve {{{','.join(PRELOAD)}}} | warm  (run by the tests and make)")
    else:
        serve(sys.argv[2])
