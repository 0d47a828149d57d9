"""The workflow tests' Snakemake invocations (tests/helpers/snakemake_fork.py) behave as processes started
from a shell: each is a process of its own with the working directory, environment and arguments it was
given, its exit status (or the signal that killed it) is what the caller sees, and its output is captured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import snakemake_fork

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
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    env = {**os.environ, "FORK_TEST_X": "forty-two"}
    first = snakemake_fork.run([SNAKEMAKE, "-s", str(snakefile), "--cores", "1"], env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    seen = _fields(first.stdout)
    template = snakemake_fork._template.proc.pid
    assert seen["parent"] == str(template) and seen["pid"] not in (str(os.getpid()), str(template))
    assert seen["cwd"] == str(work) and seen["x"] == "forty-two" and seen["argv0"] == SNAKEMAKE
    assert "to stderr" in first.stderr and "1 of 1 steps (100%) done" in first.stderr
    assert (work / "out.txt").read_text() == "forty-two\n"  # the job's shell inherited the environment
    again = snakemake_fork.run([SNAKEMAKE, "-s", str(snakefile), "--cores", "1"], env=env)
    assert again.returncode == 0 and _fields(again.stdout)["pid"] != seen["pid"]
    assert "Nothing to be done" in again.stderr


def test_the_exit_status_and_a_killing_signal_reach_the_caller(snakefile, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    usage = snakemake_fork.run([SNAKEMAKE, "--no-such-option"], env=dict(os.environ))
    assert usage.returncode == 2 and "--no-such-option" in usage.stderr
    killed = snakemake_fork.run([SNAKEMAKE, "-s", str(snakefile), "-n"], env={**os.environ, "FORK_TEST_KILL": "1"})
    assert killed.returncode == -9 and "to stderr" in killed.stderr
    missing = snakemake_fork.run([SNAKEMAKE, "-s", str(tmp_path / "absent"), "-n"], env=dict(os.environ))
    assert missing.returncode == 1


def test_exec_runs_the_console_script_itself(snakefile, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CKPTFLOW_TEST_SNAKEMAKE", "exec")
    done = snakemake_fork.run([SNAKEMAKE, "-s", str(snakefile), "-n"], env=dict(os.environ))
    assert done.returncode == 0
    assert _fields(done.stdout)["parent"] == str(os.getpid())  # started by this process, not the template
    assert isinstance(done, subprocess.CompletedProcess)
