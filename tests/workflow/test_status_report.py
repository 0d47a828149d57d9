"""The status rule (the default target) and `snakemake --report`: the table is a report item."""

from __future__ import annotations

import base64
import json
import re
import shutil

import pytest
from workflow_helpers import RUN, Flow

from ckptflow.workflow.steps import prune_step, publish_step, verify_step
from helpers.artifacts import make_artifact
from helpers.cli import run_cli


def _flow(tmp_path) -> Flow:
    archive = tmp_path / "arch"
    archive.mkdir()
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{archive}"})
    for iteration in (300, 400):
        art = make_artifact(flow.runs / RUN, iteration=iteration, seed=iteration)
        (art / "optim.pt").unlink()
    (flow.artifact(400) / ".uploaded").write_text("uploaded by sync.sh\n", encoding="utf-8")
    return flow


# Slow (six or more Snakemake runs): rerun behaviour, like tests/workflow/test_reruns.py.
@pytest.mark.slow
def test_status_writes_and_prints_the_table_and_reruns_only_when_a_record_changed(tmp_path):
    flow = _flow(tmp_path)
    done = flow.run("status")
    assert done.returncode == 0, done.stdout + done.stderr
    printed = done.stdout.splitlines()
    assert any("iter_000300" in line for line in printed)
    assert any("iter_000400" in line and "legacy receipt" in line for line in printed)
    reports = flow.root / "reports"
    table = json.loads((reports / "status.json").read_text())
    assert "iter_000400" in json.dumps(table) and "iter_000300" in (reports / "status.txt").read_text()
    flow.nothing_planned("status", "all")  # `all`, the default target

    (flow.artifact(300) / "NOTES.md").write_text("unrelated\n", encoding="utf-8")
    (reports / "other.json").write_text("{}", encoding="utf-8")
    assert flow.planned() == []

    flow.ok("publish_all")  # a receipt written and a legacy one replaced: the table is out of date
    assert flow.planned() == ["status", "all"]
    flow.ok()
    rows = [line for line in (reports / "status.txt").read_text().splitlines() if "iter_000" in line]
    assert len(rows) == 2 and not any("legacy receipt" in row for row in rows)
    assert flow.planned() == []


def _embedded_text(html: str) -> str:
    """The report's embedded files (base64 data URIs), decoded."""
    found = re.findall(r";base64,([A-Za-z0-9+/=]+)", html)
    return "\n".join(base64.b64decode(b).decode("utf-8", "replace") for b in found)


@pytest.mark.slow
def test_the_html_report_is_self_contained_and_names_every_iteration(tmp_path):
    flow = _flow(tmp_path)
    flow.ok("status")
    report = flow.root / "report.html"
    flow.ok("--report", str(report))
    html = report.read_text(encoding="utf-8")
    assert not re.search(r'(src|href)="https?://', html)  # nothing to load: it works offline
    embedded = _embedded_text(html)
    assert "status.txt" in html and "status.json" in html
    for iteration in ("iter_000300", "iter_000400"):
        assert iteration in embedded, iteration


def _published_and_pruned(tmp_path, *iterations: int, keep: tuple[int, ...] = ()) -> Flow:
    """Artifacts of RUN published to a file:// archive, verified and pruned by the library's steps (the
    workflow's own), except those in ``keep``, which stay published and verified with their payloads."""
    archive = tmp_path / "arch"
    archive.mkdir()
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{archive}"})
    bucket = flow.config["bucket"]
    for iteration in iterations:
        art = make_artifact(flow.runs / RUN, iteration=iteration, seed=iteration)
        (art / "optim.pt").unlink()
        publish_step(str(art), f"{RUN}/checkpoints", bucket, None)
        verify_step(str(art), None, str(flow.report("verify", iteration)))
        if iteration not in keep:
            prune_step(str(art), None, str(flow.report("prune", iteration)))
    return flow


@pytest.mark.slow
def test_a_receipt_copied_from_another_iteration_is_refused_by_the_teacher_and_foreign_in_the_table(tmp_path):
    flow = _published_and_pruned(tmp_path, 200, 300)
    copied = flow.artifact(300) / ".uploaded"
    shutil.copy2(flow.artifact(200) / ".uploaded", copied)  # the mtime is kept: older than 300's verify report
    out = flow.fails("materialize_teacher", iter=300, base=str(tmp_path / "base"))
    assert str(copied) in out and "written for another artifact" in out, out
    assert not flow.staged(300).exists() and not flow.teacher(300).exists()  # nothing fetched, nothing built
    flow.ok("status")
    row = next(r for r in json.loads((flow.root / "reports" / "status.json").read_text())["rows"]
               if r["iteration"] == 300)
    assert row["published"]["state"] == "foreign" and row["verified"].get("stale") is True
    assert row["pruned"]["state"] == "missing" and row["materialized"]["state"] == "none"
    line = next(line for line in (flow.root / "reports" / "status.txt").read_text().splitlines()
                if "iter_000300" in line and RUN in line)
    assert "foreign" in line and "pruned" not in line


# Slow (six or more Snakemake runs): rerun behaviour, like tests/workflow/test_reruns.py.
@pytest.mark.slow
def test_the_table_is_rebuilt_when_a_payload_is_pruned_or_lost_behind_the_workflow(tmp_path):
    flow = _published_and_pruned(tmp_path, 300, 400, keep=(300, 400))
    flow.ok("status")
    assert flow.planned() == []
    art = flow.artifact(300)
    pruned = run_cli("prune-verified", "--paths", str(art), env=flow.env)  # the CLI writes no record
    assert pruned.returncode == 0 and pruned.report["removed"], pruned.stderr
    assert flow.planned() == ["status", "all"]
    report = flow.root / "report.html"
    flow.ok("--report", str(report))  # never an old table: the report embeds the table of now
    embedded = _embedded_text(report.read_text(encoding="utf-8"))
    assert '"state": "pruned"' in embedded, embedded[:2000]
    flow.ok()
    rows = {r["iteration"]: r for r in json.loads((flow.root / "reports" / "status.json").read_text())["rows"]}
    assert rows[300]["pruned"]["state"] == "pruned"
    assert flow.planned() == []
    (flow.artifact(400) / "optim" / "__0_0.distcp").unlink()  # lost by accident: no record changes
    assert flow.planned() == ["status", "all"]
    flow.ok()
    rows = {r["iteration"]: r for r in json.loads((flow.root / "reports" / "status.json").read_text())["rows"]}
    assert rows[400]["pruned"]["state"] == "partial"
    assert flow.planned() == []
