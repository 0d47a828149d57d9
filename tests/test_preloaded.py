"""The workflow tests' Snakemake invocations (tests/helpers/preloaded.py) behave as processes started
from a shell: each is a process of its own with the working directory, environment and arguments it was
given, its exit status (or the signal that killed it) is what the caller sees, and its output is captured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, preloaded

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))
SNAKEFILE = """
import os, sys
print("pid", os.getpid(), "parent", os.getppid(), "cwd", os.getcwd(), "x", os.environ.get("FORK_TEST_X"),
      "argv0", sys.argv[0], flush=True)
print("to stderr", file=sys.stderr, flush=True)
if os.environ.get("FORK_TEST_KILL"):
    os.kill(os.getpid(), 9)

rule all:
    output: "out.txt"
    shell: "echo $FORK_TEST_X > {output}"
"""


@pytest.fixture
def snakefile(tmp_path: Path) -> Path:
    path = tmp_path / "Snakefile"
    path.write_text(SNAKEFILE, encoding="utf-8")
    return path


def _fields(out: str) -> dict[str, str]:
    line = next(line for line in out.splitlines() if line.startswith("pid "))
    words = line.split()
    return dict(zip(words[::2], words[1::2], strict=True))


def test_an_invocation_is_its_own_process_with_the_given_directory_environment_and_arguments(
        snakefile, tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTFLOW_TEST_PRELOADED", "snakemake")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env = {**os.environ, "FORK_TEST_X": "forty-two"}
    first = preloaded.snakemake([SNAKEMAKE, "-s", str(snakefile), "--cores", "1"], env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    seen = _fields(first.stdout)
    template = preloaded._templates["snakemake"].proc.pid
    assert seen["parent"] == str(template) and seen["pid"] not in (str(os.getpid()), str(template))
    assert seen["cwd"] == str(work) and seen["x"] == "forty-two" and seen["argv0"] == SNAKEMAKE
    assert "to stderr" in first.stderr and "1 of 1 steps (100%) done" in first.stderr
    assert (work / "out.txt").read_text() == "forty-two\n"  # the job's shell inherited the environment
    again = preloaded.snakemake([SNAKEMAKE, "-s", str(snakefile), "--cores", "1"], env=env)
    assert again.returncode == 0 and _fields(again.stdout)["pid"] != seen["pid"]
    assert "Nothing to be done" in again.stderr


def test_the_exit_status_and_a_killing_signal_reach_the_caller(snakefile, tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTFLOW_TEST_PRELOADED", "snakemake")
    monkeypatch.chdir(tmp_path)
    usage = preloaded.snakemake([SNAKEMAKE, "--no-such-option"], env=dict(os.environ))
    assert usage.returncode == 2 and "--no-such-option" in usage.stderr
    killed = preloaded.snakemake([SNAKEMAKE, "-s", str(snakefile), "-n"], env={**os.environ, "FORK_TEST_KILL": "1"})
    assert killed.returncode == -9 and "to stderr" in killed.stderr
    missing = preloaded.snakemake([SNAKEMAKE, "-s", str(tmp_path / "absent"), "-n"], env=dict(os.environ))
    assert missing.returncode == 1


@pytest.mark.slow
def test_exec_runs_the_console_script_itself(snakefile, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CKPTFLOW_TEST_PRELOADED", "0")
    done = preloaded.snakemake([SNAKEMAKE, "-s", str(snakefile), "-n"], env=dict(os.environ))
    assert done.returncode == 0
    assert _fields(done.stdout)["parent"] == str(os.getpid())  # started by this process, not the template
    assert isinstance(done, subprocess.CompletedProcess)


def _both(*args: str, **env: str) -> tuple[subprocess.CompletedProcess, subprocess.CompletedProcess]:
    argv = [sys.executable, "-m", "ckptflow", *args]
    full = {**os.environ, "CKPTFLOW_PROGRESS": "0", **env}
    forked = preloaded.ckptflow(argv, cwd=REPO, env=full, timeout=300)
    started = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=300, cwd=REPO)
    return forked, started


@pytest.mark.slow
def test_a_forked_ckptflow_verb_answers_as_one_started_from_a_shell(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTFLOW_TEST_PRELOADED", "ckptflow")
    template = preloaded._template("ckptflow")
    before = template.next_id
    for args in (("materialize",), ("merge", "--mode", "avg", "--experts", str(tmp_path / "absent.pt"),
                                    "--out", str(tmp_path / "out"))):
        forked, started = _both(*args)
        assert (forked.returncode, forked.stdout, forked.stderr) == (started.returncode, started.stdout,
                                                                     started.stderr), args
        assert forked.returncode in (1, 2) and forked.stderr.strip(), args
    assert template.next_id == before + 2  # both went through the template
    # An environment that changes how an interpreter starts is never given to a template's fork.
    other = preloaded.ckptflow([sys.executable, "-m", "ckptflow", "materialize"], cwd=REPO,
                               env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=300)
    assert other.returncode == 2 and template.next_id == before + 2
