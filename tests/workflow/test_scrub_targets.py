"""The workflow's scrub_all: every published artifact under runs_root read back and hashed by real
Snakemake, one config slice per report under reports/scrub/ (never a record); damage fails the job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from workflow_helpers import RUN, Flow

from ckptflow.jsonio import validate
from ckptflow.records import receipt as receipt_record
from helpers.artifacts import make_artifact
from helpers.trees import tree_state

DECLARATION = ".posttrain-archive.json"


def _published(tmp_path: Path) -> tuple[Flow, list[Path]]:
    archive = tmp_path / "arch"
    archive.mkdir()
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{archive}"})
    arts = [make_artifact(flow.runs / RUN, iteration=it, seed=it) for it in (300, 400)]
    for art in arts:
        (art / "optim.pt").unlink()  # an unselected file: not part of the artifact
    flow.ok("publish_all")
    return flow, arts


def _report(flow: Flow, name: str) -> dict:
    report = json.loads((Path(flow.config["reports_dir"]) / "scrub" / f"{name}.json").read_text())
    validate(report, "report_verify", what="scrub report")
    return report


@pytest.mark.slow
def test_scrub_all_slices_read_every_file_once_and_damage_fails_the_job(tmp_path):
    flow, arts = _published(tmp_path)
    before = {art: tree_state(art) for art in arts}

    seen = []
    for k in (1, 2):
        flow.ok("scrub_all", scrub_subset=f"{k}/2")
        report = _report(flow, f"{k}-of-2")
        assert report["status"] == "verified" and report["subset"] == f"{k}/2"
        seen += [(row["artifact_dir"], o["path"]) for row in report["artifacts"] for o in row["objects"]
                 if o["path"] != DECLARATION]
    recorded = [(str(art), f.path) for art in arts for f in receipt_record.read_receipt(art).files]
    assert sorted(seen) == sorted(recorded)
    assert {art: tree_state(art) for art in arts} == before  # a scrub writes no record beside an artifact

    flow.ok("scrub_all")
    assert _report(flow, "all")["bytes_read"] > 0

    dest = receipt_record.read_receipt(arts[1]).destination
    damaged = Path(dest.endpoint) / dest.prefix / "optim" / "__2_0.distcp"
    data = bytearray(damaged.read_bytes())
    data[3] ^= 0x10
    damaged.write_bytes(bytes(data))
    out = flow.fails("scrub_all", "--forcerun", "scrub")
    log = (Path(flow.config["logs_dir"]) / "scrub" / "all.log").read_text()
    assert "optim/__2_0.distcp: mismatch" in log, out
