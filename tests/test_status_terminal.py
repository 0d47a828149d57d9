"""``ckptflow status`` on a terminal: the table fits its width (times as ages, teacher paths relative to
the teachers directory, else a compact per-run layout), ``--wide`` shows everything, a pipe gets the JSON
report; and a ``ckptflow verify`` run from the command line is what the VERIFIED column shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ckptflow.jsonio import validate
from helpers.artifacts import ARTIFACT_PREFIX, make_artifact
from helpers.cli import run_cli, run_on_terminal
from test_status import RUN, cli_args, probe_cache, runs  # noqa: F401 - fixtures shared with test_status

_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def _table(out: str) -> list[str]:
    """The lines before the details (the details are messages, wrapped but never cut)."""
    return out.split("\ndetails", 1)[0].splitlines()


@pytest.mark.slow
def test_on_an_80_column_terminal_the_table_fits_and_wide_shows_everything(runs):  # noqa: F811
    proc = run_on_terminal(*cli_args(runs), columns=80)
    assert proc.returncode == 0, proc.stderr
    table = _table(proc.stdout)
    assert all(len(line) <= 80 for line in table), "\n".join(line for line in table if len(line) > 80)
    text = "\n".join(table)
    assert re.search(r"verified \d+[smhd] ago", text) and not _TIMESTAMP.search(text), text
    assert str(runs["teachers"]) not in text and "archive" in text and RUN in text
    assert re.search(r"^  500 +committed", text, re.M), text

    wide = run_on_terminal(*cli_args(runs), "--wide", columns=80)
    assert wide.returncode == 0, wide.stderr
    assert max(map(len, _table(wide.stdout))) > 80 and _TIMESTAMP.search(wide.stdout)
    assert "iter_000500" in wide.stdout and "(archive)" in wide.stdout

    piped, piped_wide = run_cli(*cli_args(runs)), run_cli(*cli_args(runs), "--wide")
    validate(piped.report, "report_status", what="status report")
    assert piped.report == piped_wide.report


def test_a_wide_enough_terminal_keeps_every_column_with_ages_and_relative_teacher_paths(runs):  # noqa: F811
    proc = run_on_terminal(*cli_args(runs), columns=400)
    assert proc.returncode == 0, proc.stderr
    text = "\n".join(_table(proc.stdout))
    assert "MATERIALIZED" in text and "iter_000700" in text and not _TIMESTAMP.search(text)
    assert f"{RUN}/iter_000500 (archive)" in text and str(runs["teachers"]) not in text


def _verified(root: Path) -> dict:
    proc = run_cli("status", str(root))
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_status", what="status report")
    return proc.report


@pytest.mark.slow
def test_a_verify_from_the_command_line_is_what_status_shows(tmp_path):
    root, archive = tmp_path / "runs", tmp_path / "archive"
    archive.mkdir()
    art = make_artifact(root / RUN, iteration=300)
    (art / "optim.pt").unlink()  # an unselected file would (rightly) block pruning
    env = {"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}
    assert run_cli("publish", "--artifact-dir", str(art), "--bucket", f"file://{archive}", env=env).returncode == 0
    assert _verified(root)["rows"][0]["verified"]["state"] == "none"

    assert run_cli("verify", "--artifact-dir", str(art), env=env).returncode == 0
    report = _verified(root)
    cell = report["rows"][0]["verified"]
    assert cell["state"] == "verified" and cell["source"] == "record" and "stale" not in cell
    assert report["counts"]["verified"] == 1
    shown = run_on_terminal("status", str(root), columns=80)
    assert re.search(r"verified \d+s ago", shown.stdout), shown.stdout

    pruned = run_cli("prune-verified", "--paths", str(art), env=env)  # the record is no unarchived file
    assert pruned.returncode == 0 and pruned.report["removed"], pruned.stdout + pruned.stderr

    damaged = archive / ARTIFACT_PREFIX / "optim" / "__0_0.distcp"
    damaged.chmod(0o644)
    damaged.write_bytes(b"x" * damaged.stat().st_size)
    assert run_cli("verify", "--artifact-dir", str(art), env=env).returncode == 1
    report = _verified(root)
    assert report["rows"][0]["verified"]["state"] == "failed" and report["counts"]["verified"] == 0
    assert "1 of 8 objects were not ok" in report["rows"][0]["verified"]["detail"]
