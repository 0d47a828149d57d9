"""The status rule (the default target) and `snakemake --report`: the table is a report item."""

from __future__ import annotations

import base64
import json
import re

from workflow_helpers import RUN, Flow

from helpers.artifacts import make_artifact


def _flow(tmp_path) -> Flow:
    archive = tmp_path / "arch"
    archive.mkdir()
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{archive}"})
    for iteration in (300, 400):
        art = make_artifact(flow.runs / RUN, iteration=iteration, seed=iteration)
        (art / "optim.pt").unlink()
    (flow.artifact(400) / ".uploaded").write_text("uploaded by sync.sh\n", encoding="utf-8")
    return flow


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
    assert flow.planned("status") == [] and flow.planned() == []

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
