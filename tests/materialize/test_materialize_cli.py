"""``ckptflow materialize`` on the command line: exit codes, one JSON report, its own flags."""

from __future__ import annotations

import pytest
from materialize_helpers import cli_args, cli_env, lock_file, siblings

from ckptflow.commands.materialize import parse_size
from ckptflow.errors import UsageError
from ckptflow.jsonio import validate
from helpers.cli import run_cli


@pytest.mark.slow
def test_build_then_skip_then_refuse(models, tmp_path):
    out = tmp_path / "teacher"
    args = cli_args(models.artifact(), models.base(), out)
    proc = run_cli(*args, env=cli_env(CKPTFLOW_PROGRESS="1"))  # bars go to stderr; stdout stays one JSON line
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_materialize", what="materialize report")
    assert proc.report["status"] == "built" and proc.report["out"] == str(out)

    proc = run_cli(*args)
    assert proc.returncode == 0 and proc.report["status"] == "skipped"
    validate(proc.report, "report_materialize", what="materialize report")

    proc = run_cli(*cli_args(models.artifact("qwen3", 2), models.base(), out))
    assert proc.returncode == 1
    validate(proc.report, "report_error", what="error report")
    assert proc.report["status"] == "refused"
    assert proc.stderr.count("\n") == 1 and str(out) in proc.stderr and "--force" in proc.stderr
    assert siblings(out) == []


@pytest.mark.parametrize("extra", [
    ["--artifact-uri", "file:///x/iter_000001"],  # two sources
    ["--lock-wait-seconds", "inf"],
    ["--lock-wait-seconds", "nan"],
    ["--lock-wait-seconds", "-1"],
    ["--lock-wait-seconds", "soon"],
    ["--max-shard-size", "lots"],
])
def test_usage_errors_exit_2_and_touch_nothing(models, tmp_path, extra):
    out = tmp_path / "teacher"
    proc = run_cli(*cli_args(models.artifact(), models.base(), out, *extra))
    assert proc.returncode == 2, proc.stderr
    assert not out.exists() and siblings(out) == [] and not lock_file(out).exists()


@pytest.mark.slow
def test_lock_wait_seconds_is_accepted_and_the_lock_file_goes_with_its_holder(models, tmp_path):
    out = tmp_path / "teacher"
    proc = run_cli(*cli_args(models.artifact(), models.base(), out, "--lock-wait-seconds", "0"))
    assert proc.returncode == 0, proc.stderr
    assert proc.report["status"] == "built"
    assert not lock_file(out).exists()  # the request created it and removed it when done


@pytest.mark.parametrize(("text", "value"), [("100000", 100_000), ("5GB", 5 * 10**9), ("4GiB", 4 * 2**30),
                                             ("100kb", 100_000), ("1MiB", 2**20)])
def test_max_shard_size_accepts_bytes_and_units(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["0", "-1", "5 GBs", "1.5GB", ""])
def test_max_shard_size_refuses_other_text(text):
    with pytest.raises(UsageError):
        parse_size(text)
