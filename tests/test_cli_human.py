"""The CLI's face for people: on a terminal every verb prints a short summary (what, how many files and
bytes, where, how long; a refusal as its one line); on a pipe, or with ``--json``, the JSON report exactly
as before. Each verb is driven for real with stdout on a pseudo-terminal."""

from __future__ import annotations

import json
import re

import pytest

from ckptflow import cli
from ckptflow.commands import seal as seal_command
from ckptflow.commands import summary
from ckptflow.jsonio import validate
from helpers.cli import run_cli, run_on_terminal

PREFIX = "proj/group/run1/20261129T000000Z"
MODEL_BYTES = 3 * 2**20


@pytest.fixture
def env(tmp_path):
    return {"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}


@pytest.fixture
def artifact(tmp_path):
    """An unsealed iter_000007 holding exactly the files seal will name: model.pt (3 MiB) and optim/."""
    art = tmp_path / "run" / "checkpoint_artifacts" / "iter_000007"
    (art / "optim").mkdir(parents=True)
    (art / "model.pt").write_bytes(b"m" * MODEL_BYTES)
    (art / "optim" / ".metadata").write_bytes(b"x")
    (art / "optim" / "__0_0.distcp").write_bytes(b"y" * 10)
    return art


def _summary(proc, *needles: str) -> str:
    """A summary on the terminal: no JSON, every needle, and how long it took on the last line."""
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert not out.lstrip().startswith("{") and '"status":' not in out, out
    for needle in needles:
        assert needle in out, f"{needle!r} not in\n{out}"
    assert re.search(r"\n  took +[0-9.]+ s\n\Z", out), out
    return out


def _same_json(*args: str, env: dict, code: int = 0) -> dict:
    """``--json`` on a terminal, after the verb or before it, prints byte for byte what a pipe gets."""
    piped = run_cli(*args, env=env)
    after = run_on_terminal(*args, "--json", env=env)
    before = run_on_terminal("--json", *args, env=env)
    assert piped.returncode == after.returncode == before.returncode == code, (piped.stderr, after.stderr)
    assert after.stdout == piped.stdout == before.stdout
    assert after.stderr == piped.stderr == before.stderr
    return piped.report


def _seal(artifact, env):
    return run_on_terminal("seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt", "optim=optim",
                           env=env)


def _publish_args(artifact, archive):
    return ("publish", "--artifact-dir", str(artifact), "--upload-prefix", f"{PREFIX}/checkpoints",
            "--bucket", f"file://{archive}")


@pytest.mark.slow
def test_seal_publish_verify_prune_fetch_probe_read_as_summaries_on_a_terminal(artifact, tmp_path, env):
    archive = tmp_path / "archive"
    archive.mkdir()
    where = f"file://{archive}/{PREFIX}/checkpoint_artifacts/iter_000007"

    _summary(_seal(artifact, env), "sealed iteration 7: 2 components (model, optim), 3 files, 3.00 MiB",
             f"artifact  {artifact}\n")
    refused = _same_json("seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt", env=env, code=1)
    validate(refused, "report_error", what="error report")

    probe = ("probe", "--bucket", f"file://{archive}", "--prefix", f"{PREFIX}/checkpoints")
    _summary(run_on_terminal(*probe, env=env), f"passed: file://{archive} enforces create-once",
             "race         1 of 8 creators won")
    validate(_same_json(*probe, env=env), "report_probe", what="probe report")

    _summary(run_on_terminal(*_publish_args(artifact, archive), env=env), "published 4 files, 3.00 MiB",
             f"archive   {where}\n", "uploaded  3 files, 3.00 MiB\n")
    again = _same_json(*_publish_args(artifact, archive), env=env)
    assert again["status"] == "skipped"

    verify = ("verify", "--artifact-dir", str(artifact))
    _summary(run_on_terminal(*verify, env=env), "verified 5 objects of the archive (contents read and hashed)",
             f"archive   {where}\n")
    validate(_same_json(*verify, env=env), "report_verify", what="verify report")

    prune = ("prune-verified", "--paths", str(artifact), "--dry-run")
    _summary(run_on_terminal(*prune, env=env),
             "dry run: would free 3.00 MiB (3 files of 1 artifact), 0 artifacts kept; nothing was deleted",
             f"would remove  {artifact} (3 files, 3.00 MiB)\n")
    assert _same_json(*prune, env=env)["removed"][0]["bytes"] == MODEL_BYTES + 11
    assert (artifact / "model.pt").stat().st_size == MODEL_BYTES

    fetch = ("fetch", "--artifact-uri", where, "--dst", str(tmp_path / "stage"))
    _summary(run_on_terminal(*fetch, env=env), "fetched iteration 7: 4 files, 3.00 MiB", f"from        {where}\n",
             f"to          {tmp_path / 'stage' / 'iter_000007'}\n", "downloaded  3 files, 3.00 MiB\n")
    assert _same_json(*fetch, env=env)["status"] == "already-staged"


@pytest.mark.slow
def test_a_failed_verify_lists_what_failed_and_keeps_its_stderr_line(artifact, tmp_path, env):
    archive = tmp_path / "archive"
    archive.mkdir()
    assert _seal(artifact, env).returncode == 0
    assert run_cli(*_publish_args(artifact, archive), env=env).returncode == 0
    (archive / PREFIX / "checkpoint_artifacts" / "iter_000007" / "model.pt").unlink()

    verify = ("verify", "--artifact-dir", str(artifact))
    shown = run_on_terminal(*verify, env=env)
    piped = _same_json(*verify, env=env, code=1)
    assert shown.returncode == 1
    assert shown.stderr == run_cli(*verify, env=env).stderr and shown.stderr.count("\n") == 1
    assert shown.stdout.startswith("failed: 1 of 5 objects not ok"), shown.stdout
    assert re.search(r"^  missing +model\.pt", shown.stdout, re.M), shown.stdout
    assert piped["status"] == "failed"


def test_a_refusal_on_a_terminal_is_its_one_line(artifact, env):
    args = ("seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt")
    assert run_on_terminal(*args, "optim=optim", env=env).returncode == 0  # sealed with other components
    piped = run_cli(*args, env=env)
    shown = run_on_terminal(*args, env=env)
    assert shown.returncode == piped.returncode == 1
    assert shown.stderr == piped.stderr  # the stderr line is unchanged
    line = piped.stderr
    assert line.count("\n") == 1 and line.startswith("ckptflow seal: refused: ") and "seal into a new" in line
    assert shown.stdout == line  # stderr is a pipe here: the terminal gets the same one line

    both = run_on_terminal(*args, env=env, stderr_terminal=True)  # one terminal for both: the line once
    assert both.returncode == 1 and both.stdout == line


def test_a_usage_error_on_a_terminal_is_its_one_line(artifact, env):
    args = ("seal", "--artifact-dir", str(artifact), "--iteration", "7", "not-a-spec")
    shown = run_on_terminal(*args, env=env)
    assert shown.returncode == 2
    assert shown.stdout == shown.stderr and shown.stderr.startswith("ckptflow seal: usage error: ")
    assert _same_json(*args, env=env, code=2)["status"] == "usage-error"


@pytest.mark.slow  # torch in every subprocess
def test_merge_and_materialize_read_as_summaries_on_a_terminal(tmp_path, env):
    from helpers import tiny_models as tm

    base = tm.build_tiny_base("qwen3", tmp_path / "base")
    sd = tm.in_memory_state_dict(base)
    experts = []
    for i in range(2):
        (tmp_path / f"e{i}").mkdir()
        experts.append(str(tm.save_consolidated(tm.perturbed(sd, 0.01, seed=i), tmp_path / f"e{i}" / "model.pt")))
    out = tmp_path / "run" / "checkpoint_artifacts" / "iter_000300" / "model.pt"
    merge = ("merge", "--mode", "avg", "--experts", ",".join(experts), "--out", str(out))
    shown = _summary(run_on_terminal(*merge, env=env), "merged 2 experts by average into iteration 300: ",
                     f"out     {out}\n", "why     no previous output\n")
    model_size = out.stat().st_size
    assert f"model.pt {summary.human_bytes(model_size)}" in shown.splitlines()[0]
    again = run_on_terminal(*merge, "--json", env=env)  # the pipe's JSON is covered above; torch makes runs slow
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "skipped"

    teacher = tmp_path / "teacher"
    materialize = ("materialize", "--ckpt-dir", str(out.parent), "--base", str(base), "--out", str(teacher),
                   "--min-tensors", "1")
    _summary(run_on_terminal(*materialize, env=env), "built the Hugging Face model: ", f"out       {teacher}\n",
             f"from      {out.parent} (model.pt {summary.human_bytes(model_size)})\n", "checks passed, ")
    again = run_on_terminal(*materialize, "--json", env=env)
    assert again.returncode == 0 and again.stdout.count("\n") == 1
    report = json.loads(again.stdout)
    assert report["status"] == "skipped"
    validate(report, "report_materialize", what="materialize report")


def test_units_are_human():
    sizes = (0, 1023, 1024, 1536, 10 * 2**20 - 1, 100 * 2**20 - 1, 2**30 - 1, 3 * 2**30, 2**50 * 5000)
    assert [summary.human_bytes(n) for n in sizes] == [
        "0 B", "1023 B", "1.00 KiB", "1.50 KiB", "10.0 MiB", "100 MiB", "1.00 GiB", "3.00 GiB", "5000 PiB"]
    assert [summary.human_duration(s) for s in (0.123, 42.04, 123, 3725)] == [
        "0.12 s", "42.0 s", "2 min 03 s", "1 h 02 min"]
    s3 = {"scheme": "s3", "endpoint": "127.0.0.1:18333", "bucket": "b", "prefix": "p/iter_1"}
    assert summary.destination_uri(s3) == "s3://b/p/iter_1 at 127.0.0.1:18333"
    assert summary.destination_uri({"scheme": "file", "endpoint": "/arch/", "bucket": ""}) == "file:///arch"


def test_a_verb_without_its_own_summary_gets_key_value_lines(monkeypatch):
    monkeypatch.delattr(seal_command, "summarize")
    report = {"status": "sealed", "artifact_dir": "/a/iter_000007", "components": ["model"], "files": 1,
              "total_bytes": 5, "inventory": [{"path": "model.pt"}]}
    assert summary.render("seal", report, 1.5).splitlines() == [
        "sealed", "  artifact_dir  /a/iter_000007", "  components    model", "  files         1",
        "  inventory     1 entries", "  total_bytes   5", "  took          1.50 s"]


def test_a_summary_that_breaks_falls_back_without_changing_the_outcome(artifact, monkeypatch, capsys, caplog):
    def broken(report, elapsed):
        raise KeyError("iteration")

    monkeypatch.setattr(seal_command, "summarize", broken)
    monkeypatch.setattr(cli, "_is_terminal", lambda stream: True)
    assert cli.main(["seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("sealed\n") and "  files         1\n" in captured.out
    assert "no summary for this report (KeyError" in caplog.text


def test_a_failed_verify_or_resume_check_on_one_terminal_says_it_once(artifact, tmp_path, env):
    archive = tmp_path / "archive"
    archive.mkdir()
    assert _seal(artifact, env).returncode == 0
    assert run_cli(*_publish_args(artifact, archive), env=env).returncode == 0
    (archive / PREFIX / "checkpoint_artifacts" / "iter_000007" / "model.pt").unlink()
    both = run_on_terminal("verify", "--artifact-dir", str(artifact), env=env, stderr_terminal=True)
    assert both.returncode == 1 and both.stdout.startswith("failed: 1 of 5 objects not ok"), both.stdout
    assert "ckptflow verify:" not in both.stdout and both.stdout.count("model.pt") == 1, both.stdout

    attempt = artifact.parent.parent  # holds the committed model-only artifact: a step-0 restart is refused
    both = run_on_terminal("resume-check", "--attempt-dir", str(attempt), env=env, stderr_terminal=True)
    assert both.returncode == 1 and both.stdout.startswith("refused: "), both.stdout
    assert both.stdout.count("step-0 restart") == 1 and both.stdout.count("remedy 1") == 1, both.stdout


def test_retain_and_prune_summaries_list_what_was_removed_before_what_was_kept(tmp_path, env):
    run = tmp_path / "ts"
    for it in (1, 2, 3):
        d = run / "checkpoints" / f"iter_{it:07d}"
        d.mkdir(parents=True)
        (d / "model.pt").write_bytes(b"m" * 2048)
        (d / "trainer.pt").write_bytes(b"t" * 10)
        (d / ".uploaded").write_text("uploaded to s3://old-tool\n")
    out = _summary(run_on_terminal("retain-checkpoints", "--run-dir", str(run), "--keep-last", "1", env=env),
                   "removed 2 checkpoints (4.07 KiB), kept 1")
    lines = out.splitlines()[1:]  # the rows after the headline
    removed = [i for i, line in enumerate(lines) if line.lstrip().startswith("removed ")]
    kept = [i for i, line in enumerate(lines) if line.lstrip().startswith("kept ")]
    assert len(removed) == 2 and len(kept) == 1 and max(removed) < min(kept), out
    assert f"{run / 'checkpoints' / 'iter_0000001'} (2.04 KiB)" in out
    assert f"kept     {run / 'checkpoints' / 'iter_0000003'}: one of the last 1" in out

    missing = tmp_path / "run" / "checkpoint_artifacts" / "iter_000001"
    shown = run_on_terminal("prune-verified", "--paths", str(missing), env=env)
    assert shown.returncode == 1 and shown.stdout.startswith("failed: nothing freed, 1 artifact kept"), shown.stdout
    assert f"kept  {missing}: {missing} does not exist" in shown.stdout
