"""The workflow tests' Snakemake invocations (tests/helpers/preloaded.py) behave as processes started
from a shell: each is a process of its own with the working directory, environment and arguments it was
given, its exit status (or the signal that killed it) is what the caller sees, and its output is captured."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, preloaded
from helpers.cli import finish, run_on_terminal, start_cli, wait_for_file

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
    # Every other verb forks from the template that imported none of the extras: no torch in it at all.
    monkeypatch.setenv("CKPTFLOW_TEST_PRELOADED", "ckptflow-core")
    argv = [sys.executable, "-m", "ckptflow", "verify", "--artifact-dir", str(tmp_path / "absent")]
    full = {**os.environ, "CKPTFLOW_PROGRESS": "0"}
    forked = preloaded.ckptflow(argv, cwd=REPO, env=full, timeout=300, kind="ckptflow-core")
    started = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=300, cwd=REPO)
    assert (forked.returncode, forked.stdout, forked.stderr) == (started.returncode, started.stdout, started.stderr)
    assert forked.returncode in (1, 2) and forked.stderr.strip()
    core = preloaded._templates["ckptflow-core"].proc.pid
    assert "libtorch" not in Path(f"/proc/{core}/maps").read_text()
    assert "libtorch" in Path(f"/proc/{template.proc.pid}/maps").read_text()
    # An environment that changes how an interpreter starts is never given to a template's fork.
    other = preloaded.ckptflow([sys.executable, "-m", "ckptflow", "materialize"], cwd=REPO,
                               env={**os.environ, "PYTHONPATH": str(tmp_path)}, timeout=300)
    assert other.returncode == 2 and template.next_id == before + 2


def _experts(tmp_path: Path) -> tuple[str, str]:
    import torch

    paths = []
    for seed in (1, 2):
        path = tmp_path / f"expert{seed}.pt"
        torch.save({"net": {"model.layers.0.mlp.weight": torch.full((4, 4), float(seed))}}, path)
        paths.append(str(path))
    return ",".join(paths), str(tmp_path / "runs/p/g/r/20261129T000000Z/checkpoint_artifacts/iter_000001/model.pt")


@pytest.mark.slow
def test_a_started_verb_is_a_fork_handled_as_a_popen_paused_killed_or_run_to_its_end(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTFLOW_TEST_PRELOADED", "ckptflow")
    experts, out = _experts(tmp_path)
    flag = tmp_path / "paused"
    pause = {"CKPTFLOW_TEST_PAUSE_AT": "merge:after-model-write", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)}
    paused = start_cli("merge", "--mode", "avg", "--experts", experts, "--out", out, env=pause)
    assert isinstance(paused, preloaded.Started)
    wait_for_file(flag, paused)
    assert paused.poll() is None and paused.returncode is None
    assert flag.read_text().split()[0] == str(paused.pid)  # the pid the caller holds is the verb's own
    assert Path(f"/proc/{paused.pid}/stat").read_text().split()[3] == str(preloaded._templates["ckptflow"].proc.pid)
    with pytest.raises(subprocess.TimeoutExpired):
        paused.wait(0.2)
    paused.kill()
    assert paused.wait(60) == -9 and paused.poll() == -9
    paused.kill()  # once it has ended, a signal goes nowhere
    out_text, err_text = paused.communicate()
    assert out_text == "" and paused.stdout.read() == out_text and paused.stderr.read() == err_text
    [left] = [p.name for p in Path(out).parent.iterdir() if p.name.endswith(".tmp")]
    assert f".{paused.pid}." in left  # killed mid-merge: its temporary, named by its pid
    shutil.rmtree(tmp_path / "runs")

    # Run to its end, a fork's status, stdout and stderr are those of the verb started from a shell.
    forked = start_cli("merge", "--mode", "avg", "--experts", experts, "--out", out)
    forked_out, forked_err = finish(forked)
    shutil.rmtree(tmp_path / "runs")
    started = subprocess.Popen([sys.executable, "-m", "ckptflow", "merge", "--mode", "avg", "--experts", experts,
                                "--out", out], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "CKPTFLOW_PROGRESS": "0"}, cwd=REPO)
    started_out, started_err = finish(started)
    assert (forked.returncode, forked_err) == (started.returncode, started_err) == (0, "")
    assert json.loads(forked_out) == json.loads(started_out) and json.loads(forked_out)["status"] == "built"


JOBS_SNAKEFILE = """
rule all:
    input: "merge.json", "probe.json"

rule merge:
    output: "merge.json"
    threads: 1
    params: word="forty-two"
    script: "scripts/merge.py"

rule probe:
    output: "probe.json"
    threads: 2
    params: word="seven"
    script: "scripts/probe.py"

rule fail:
    script: "scripts/fail.py"

rule killed:
    script: "scripts/killed.py"
"""
PROBE = """
import json, os, sys
import torch
print("job stdout", snakemake.rule, flush=True)
print("job stderr", snakemake.rule, file=sys.stderr, flush=True)
seen = {"pid": os.getpid(), "parent": os.getppid(), "cwd": os.getcwd(), "path0": sys.path[0],
        "argv": sys.argv, "x": os.environ.get("FORK_TEST_X"), "word": snakemake.params.word,
        "threads": torch.get_num_threads(), "main": __name__}
open(snakemake.output[0], "w").write(json.dumps(seen))
"""


def _jobs_workflow(tmp_path: Path) -> Path:
    (tmp_path / "Snakefile").write_text(JOBS_SNAKEFILE, encoding="utf-8")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name in ("merge", "probe"):
        (scripts / f"{name}.py").write_text(PROBE, encoding="utf-8")
    (scripts / "fail.py").write_text("import sys\nsys.exit(3)\n", encoding="utf-8")
    (scripts / "killed.py").write_text("import os\nos.kill(os.getpid(), 9)\n", encoding="utf-8")
    return tmp_path / "Snakefile"


@pytest.mark.slow
def test_a_forked_snakemakes_script_jobs_fork_from_the_ckptflow_templates_and_end_as_started_ones(
        tmp_path, monkeypatch):
    snakefile = _jobs_workflow(tmp_path)
    env = {**os.environ, "FORK_TEST_X": "x"}
    runs = {}
    for name, switches in (("forked", "snakemake,ckptflow,ckptflow-core,snakemake-jobs"), ("started", "snakemake")):
        monkeypatch.setenv("CKPTFLOW_TEST_PRELOADED", switches)
        env["CKPTFLOW_TEST_PRELOADED"] = switches
        work = tmp_path / name
        work.mkdir()
        monkeypatch.chdir(work)
        done = preloaded.snakemake([SNAKEMAKE, "-s", str(snakefile), "--cores", "2"], env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        for rule in ("merge", "probe"):  # a job's stdout and stderr are Snakemake's
            assert f"job stdout {rule}" in done.stdout and f"job stderr {rule}" in done.stderr
        seen = {rule: json.loads((work / f"{rule}.json").read_text()) for rule in ("merge", "probe")}
        fail = preloaded.snakemake([SNAKEMAKE, "-s", str(snakefile), "--cores", "1", "fail"], env=env)
        killed = preloaded.snakemake([SNAKEMAKE, "-s", str(snakefile), "--cores", "1", "killed"], env=env)
        runs[name] = seen, fail, killed
    (forked, fail, killed), (started, *ends) = runs["forked"], runs["started"]
    # The merge job forks from the template that imported torch, the others from the one without it.
    assert forked["merge"]["parent"] == preloaded._templates["ckptflow"].proc.pid
    assert forked["probe"]["parent"] == preloaded._templates["ckptflow-core"].proc.pid
    assert started["merge"]["parent"] not in {t.proc.pid for t in preloaded._templates.values()}
    for rule in ("merge", "probe"):
        for key in ("cwd", "path0"):
            forked[rule][key] = forked[rule][key].replace(str(tmp_path / "forked"), str(tmp_path / "started"))
        for seen in (forked[rule], started[rule]):
            assert Path(seen["argv"][0]).name.endswith(f".{rule}.py") and seen.pop("argv")
            assert seen.pop("pid") != seen.pop("parent")
        # Working directory, path, environment, the rule's parameters, torch's threads (the rule's): the same.
        assert forked[rule] == started[rule], rule
    assert started["merge"]["threads"] == 1 and started["probe"]["threads"] == 2
    # A job's exit status, or the signal that ended it, is what Snakemake sees.
    for fork, start, said in ((fail, ends[0], "returned non-zero exit status 3."),
                              (killed, ends[1], "died with <Signals.SIGKILL: 9>.")):
        assert fork.returncode == start.returncode == 1
        assert said in fork.stderr and said in start.stderr


def _pause_script(work: Path, name: str) -> str:
    scripts = work / ".snakemake" / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    script = scripts / f"tmp{name}.probe.py"
    script.write_text("import os, time\nopen('pid', 'w').write(str(os.getpid()))\ntime.sleep(300)\n",
                      encoding="utf-8")
    return str(script.relative_to(work))


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"


def test_a_script_jobs_launcher_stands_for_its_job(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTFLOW_TEST_PRELOADED", "ckptflow-core,snakemake-jobs")
    launcher = preloaded._job_launcher(dict(os.environ))
    core = preloaded._templates["ckptflow-core"].proc.pid
    for sig, code in ((signal.SIGKILL, -9), (signal.SIGTERM, -15)):
        work = tmp_path / sig.name
        work.mkdir()
        proc = subprocess.Popen([launcher, _pause_script(work, "abcdefgh")], cwd=work, stderr=subprocess.PIPE,
                                text=True)
        wait_for_file(work / "pid", proc)
        deadline = time.monotonic() + 60
        while not (work / "pid").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        job = int((work / "pid").read_text())
        assert job != proc.pid and Path(f"/proc/{job}/stat").read_text().split()[3] == str(core)
        proc.send_signal(sig)  # SIGKILL: the template sees the launcher gone; SIGTERM: the launcher sends it on
        assert proc.wait(60) == code
        proc.stderr.close()
        while not _gone(job) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _gone(job), f"the job of a launcher ended by {sig.name} still runs"
    # Any other command line is the real interpreter's, as Snakemake would have started it.
    other = subprocess.run([launcher, "-c", "import sys; print(sys.flags.isolated, sys.flags.no_site)"],
                           capture_output=True, text=True, timeout=60)
    assert (other.returncode, other.stdout) == (0, "0 0\n")


@pytest.mark.slow
def test_a_verb_given_a_terminal_is_a_fork_handled_as_a_popen(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTFLOW_TEST_PRELOADED", "ckptflow,ckptflow-core")
    experts, out = _experts(tmp_path)
    flag = tmp_path / "paused"
    env = {**os.environ, "CKPTFLOW_TEST_PAUSE_AT": "merge:after-model-write", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)}
    master, slave = os.openpty()
    terminal = os.ttyname(slave)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        paused = preloaded.start_ckptflow_attached(
            [sys.executable, "-m", "ckptflow", "merge", "--mode", "avg", "--experts", experts, "--out", out],
            cwd=REPO, env=env, stdin=null, stdout=slave, stderr=slave)
    finally:
        os.close(slave)
        os.close(null)
    assert isinstance(paused, preloaded.Attached)
    deadline = time.monotonic() + 120
    while not (flag.exists() and flag.read_text()) and paused.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert flag.read_text().split()[0] == str(paused.pid)
    assert Path(f"/proc/{paused.pid}/stat").read_text().split()[3] == str(preloaded._templates["ckptflow"].proc.pid)
    assert os.readlink(f"/proc/{paused.pid}/fd/1") == os.readlink(f"/proc/{paused.pid}/fd/2") == terminal
    with pytest.raises(subprocess.TimeoutExpired):
        paused.wait(0.2)
    paused.kill()
    assert paused.wait(60) == -9 and paused.poll() == -9
    paused.kill()  # once it has ended, a signal goes nowhere
    os.close(master)
    # Run to its end on a terminal, a fork writes what the verb started with that terminal writes.
    args = ("verify", "--artifact-dir", str(tmp_path / "absent"))
    forked = run_on_terminal(*args, columns=60)
    monkeypatch.setenv("CKPTFLOW_TEST_PRELOADED", "0")
    started = run_on_terminal(*args, columns=60)
    assert (forked.returncode, forked.stdout, forked.stderr) == (started.returncode, started.stdout, started.stderr)
    assert forked.returncode in (1, 2) and forked.stderr.strip()


_OWN_IMPORT = """
import json, os, sys
sys.path.insert(0, {helpers!r})
import preloaded
preloaded.import_third_party({kind!r})
plain = (str, bytes, int, float, bool, type(None))
def value(v):
    if isinstance(v, (set, frozenset)):
        return sorted(map(repr, v))
    if isinstance(v, tuple) and all(isinstance(x, plain) for x in v):
        return repr(v)
    return repr(v) if isinstance(v, plain) else None
for _ in range(2):  # two processes, as two forks of a template would be
    read, write = os.pipe()
    if os.fork() == 0:
        reads = []
        class Recording(os._Environ):
            def __getitem__(self, key):
                reads.append(key)
                return super().__getitem__(key)
        environ = os.environ
        os.environ = Recording(environ._data, environ.encodekey, environ.decodekey, environ.encodevalue,
                               environ.decodevalue)
        preloaded.import_own({kind!r})
        os.environ = environ
        values = {{name: {{k: value(v) for k, v in vars(module).items() if not k.startswith("__") and value(v) is not None}}
                  for name, module in sys.modules.items() if name.split(".")[0] == "ckptflow"}}
        os.write(write, (json.dumps({{"reads": reads, "values": values}}) + "\\n").encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as fh:
        sys.stdout.write(fh.read().decode())
    assert os.wait()[1] == 0
"""


@pytest.mark.parametrize("kind", sorted(preloaded.OWN))
def test_a_templates_own_modules_read_no_environment_and_compute_nothing_of_their_process_at_import(kind):
    """A template imports the checkout's modules its processes start by importing (``OWN``), once, under the
    template's environment and in the template's process; a fork then runs with its own. That is the same as
    a fresh import only if none of those modules reads the environment or computes a value of its own
    process (an id, a pid, a start time) while it is imported. Checked in a fresh interpreter that loads the
    kind's third-party modules as the template does, then forks twice; each fork replaces ``os.environ`` by a
    mapping that records every read while ``import_own`` runs: no read, and every plain module-level value of
    every ckptflow module imported the same in both forks. ``PER_PROCESS`` is what a template must not
    import for that reason."""
    code = _OWN_IMPORT.format(helpers=str(REPO / "tests" / "helpers"), kind=kind)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = (json.loads(line) for line in done.stdout.splitlines())
    assert first["reads"] == [], first["reads"]
    assert "ckptflow.cli" in first["values"], sorted(first["values"])  # the modules were seen
    differ = {m: [k for k in v if v[k] != second["values"].get(m, {}).get(k)] for m, v in first["values"].items()}
    assert not {m: keys for m, keys in differ.items() if keys}, differ
    assert not set(preloaded.PER_PROCESS) & set(first["values"]), sorted(first["values"])
