"""The ``python`` that a forked Snakemake (tests/helpers/preloaded.py) runs its ``script:`` jobs with.

Snakemake runs a script job as ``bash -c "... {sys.executable} .snakemake/scripts/tmpXXXX.NAME.py"``. In a
Snakemake forked from the test template, ``sys.executable`` is a small file written by preloaded.py: an
isolated interpreter (``-IS``: no site, no environment variables read) that calls ``main`` here. For a
script job it does not import the script's modules itself: it asks a ckptflow template, over that
template's Unix socket, to fork a process that runs the script, handing it its working directory,
environment and standard streams (the descriptors themselves, ``SCM_RIGHTS``). It then stands for that
process, as ``python SCRIPT`` would have been the process:

- its exit status is the job's; a job killed by signal N kills the launcher with signal N;
- SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 sent to it are sent on to the job;
- if the launcher itself dies (SIGKILL), the template sees its connection close and kills the job.

Any other command line (``-m snakemake ...``, ``-c ...``), or a template that does not answer, is handed to
the real interpreter by ``exec``: the process is then exactly the one Snakemake would have started.

``worker`` does the same for a ``torchrun``'s workers (``PYTHON_EXEC``, preloaded.torchrun_env): each
``-u SCRIPT ARGS`` is forked from the ``hf`` template (torch imported) and the launcher stands for it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
SCRIPTS_DIR = os.path.join(".snakemake", "scripts")


def script_name(args: list[str]) -> str | None:
    """``NAME.py`` for ``[".snakemake/scripts/tmpXXXX.NAME.py"]`` (a Snakemake script job), else None."""
    if len(args) != 1 or not args[0].endswith(".py"):
        return None
    head, tail = os.path.split(os.path.abspath(args[0]))
    if not head.endswith(os.sep + SCRIPTS_DIR) or not tail.startswith("tmp") or "." not in tail[:-3]:
        return None
    return tail.split(".", 1)[1]


def main(sockets: dict[str, str | None], torch_scripts: list[str], python: str) -> None:
    """``sockets``: each ckptflow kind's socket (None where the kind starts its own interpreter)."""
    args = sys.argv[1:]
    name = script_name(args)
    _fork_or_exec(None if name is None else sockets.get("ckptflow" if name in torch_scripts else "ckptflow-core"),
                  python, args)


def worker(path: str, python: str) -> None:
    """A torchrun worker (``PYTHON_EXEC``: ``-u SCRIPT ARGS``), forked from the template listening on ``path``;
    anything else, or no template answering, starts as usual."""
    args = sys.argv[1:]
    _fork_or_exec(path if args[:1] == ["-u"] and len(args) > 1 and args[1].endswith(".py") else None, python, args)


def _fork_or_exec(path: str | None, python: str, args: list[str]) -> None:
    """``python ARGS`` forked from the template listening on ``path`` (this process standing for it), or, with
    no ``path`` or no template answering there, ``exec``'d as usual."""
    if path:
        signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)  # until the job's pid is known
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
        except OSError:  # the template is gone (its pytest process ended): start as usual
            conn.close()
        else:
            _stand_for_job(conn, [python, *args])
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    os.execv(python, [python, *args])


def _stand_for_job(conn: socket.socket, argv: list[str]) -> None:
    request = {"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    socket.send_fds(conn, [(json.dumps(request) + "\n").encode()], [0, 1, 2])
    answers = conn.makefile("rb")
    line = answers.readline()
    if not line:  # the template refused the request: start as usual
        return
    pidfd = os.pidfd_open(json.loads(line)["pid"])
    for sig in FORWARDED:
        signal.signal(sig, lambda sig, _frame: signal.pidfd_send_signal(pidfd, sig))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    line = answers.readline()
    if not line:
        os.write(2, b"job launcher: the template ended before the job did\n")
        os._exit(70)
    code = os.waitstatus_to_exitcode(json.loads(line)["status"])
    if code < 0:  # end as the job ended: by the same signal
        if -code in FORWARDED:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)
