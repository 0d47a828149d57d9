"""The command-line contract: one JSON report on stdout, exit codes 0/1/2, reports match their schemas."""

from __future__ import annotations

import json

import pytest

from ckptflow.cli import VERBS, main
from ckptflow.jsonio import validate
from helpers.cli import run_cli


@pytest.fixture
def artifact(tmp_path):
    art = tmp_path / "checkpoint_artifacts" / "iter_000007"
    (art / "optim").mkdir(parents=True)
    (art / "model.pt").write_bytes(b"m" * 1000)
    (art / "optim" / ".metadata").write_bytes(b"x")
    (art / "optim" / "__0_0.distcp").write_bytes(b"y" * 10)
    return art


def test_seal_prints_one_json_report_matching_its_schema(artifact):
    proc = run_cli("seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt", "optim=optim")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1
    report = json.loads(proc.stdout)
    validate(report, "report_seal", what="seal report")
    assert report["files"] == 3 and report["total_bytes"] == 1011 and report["components"] == ["model", "optim"]


def test_refusal_exits_1_with_one_line_naming_the_file(artifact):
    assert run_cli("seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt").returncode == 0
    proc = run_cli("seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt", "optim=optim")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    validate(report, "report_error", what="error report")
    assert report["status"] == "refused"
    assert proc.stderr.count("\n") == 1 and ".posttrain-checkpoint-artifact.json" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_usage_errors_exit_2(artifact):
    assert run_cli("seal", "--artifact-dir", str(artifact)).returncode == 2
    assert run_cli("no-such-verb").returncode == 2
    proc = run_cli("seal", "--artifact-dir", str(artifact), "--iteration", "7", "not-a-spec")
    assert proc.returncode == 2 and json.loads(proc.stdout)["status"] == "usage-error"


@pytest.mark.parametrize(("argv", "prefix", "named"), [
    (("publish",), "ckptflow publish: error: ", "--artifact-dir"),
    (("verify", "--artifact-dir"), "ckptflow verify: error: ", "--artifact-dir"),
    (("no-such-verb",), "ckptflow: error: ", "no-such-verb"),
])
def test_an_argument_error_names_its_verb_and_prints_one_json_report_when_piped(argv, prefix, named):
    proc = run_cli(*argv)
    assert proc.returncode == 2, proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if ": error: " in ln]
    assert line.startswith(prefix) and named in line, proc.stderr
    validate(proc.report, "report_error", what="error report")
    assert proc.report["status"] == "usage-error" and proc.report["error"]["type"] == "UsageError"
    assert proc.report["error"]["message"] == line.removeprefix(prefix)
    assert "Traceback" not in proc.stderr


def test_an_argument_error_on_a_terminal_is_its_usage_and_one_line_with_json_on_request(capsys, monkeypatch):
    monkeypatch.setattr("ckptflow.cli._is_terminal", lambda stream: True)
    with pytest.raises(SystemExit) as exc:
        main(["publish"])
    assert exc.value.code == 2
    out, err = capsys.readouterr()
    assert out == "" and "usage: ckptflow publish" in err and "ckptflow publish: error: " in err
    with pytest.raises(SystemExit):
        main(["publish", "--json"])
    assert json.loads(capsys.readouterr().out)["status"] == "usage-error"


def test_python_m_and_main_are_the_same_program(artifact, capsys):
    code = main(["seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["status"] == "sealed"


def test_missing_bucket_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.delenv("CKPTFLOW_BUCKET", raising=False)
    assert main(["probe", "--prefix", "p"]) == 2
    assert "CKPTFLOW_BUCKET" in capsys.readouterr().err


def test_every_verb_has_help():
    for verb in VERBS:
        proc = run_cli(verb, "--help", json_report=False)
        assert proc.returncode == 0 and verb in proc.stdout
