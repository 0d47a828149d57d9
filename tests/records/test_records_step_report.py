"""The workflow's step reports: validated against their verb's schema when written, their protocol checked
by name before the schema when read (as a record's), a report without one read as its schema allows."""

from __future__ import annotations

import json

import pytest

from ckptflow.errors import InvalidRecord
from ckptflow.records.step_report import PROTOCOL, read_step_report, write_step_report

VERIFY = {"status": "verified", "artifact_dir": "/runs/r/checkpoint_artifacts/iter_000300",
          "destination": {"scheme": "file", "endpoint": "", "bucket": "/arch", "prefix": "r/checkpoints/iter_000300"},
          "read_data": True, "objects": [], "subset": None, "bytes_read": 0}


def test_a_batch_report_is_written_with_its_protocol_and_read_back(tmp_path):
    path = tmp_path / "verify" / "iter_000300.json"
    written = write_step_report(path, {**VERIFY, "batch": "0123456789abcdef"}, "report_verify")
    assert written["protocol"] == PROTOCOL and json.loads(path.read_bytes()) == written
    assert read_step_report(path, "report_verify") == written


def test_a_field_the_schema_does_not_name_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "iter_000300.json"
    with pytest.raises(InvalidRecord, match="'unknown' was unexpected"):
        write_step_report(path, {**VERIFY, "unknown": 1}, "report_verify")
    assert not path.exists()


def test_a_report_without_protocol_is_read_as_its_schema_allows(tmp_path):
    """As the workflow wrote it before the field existed, batch included."""
    path = tmp_path / "iter_000300.json"
    path.write_text(json.dumps({**VERIFY, "batch": "0123456789abcdef"}))
    assert read_step_report(path, "report_verify")["batch"] == "0123456789abcdef"


def test_a_report_of_a_newer_ckptflow_is_refused_by_its_protocol_not_by_a_schema_error(tmp_path):
    path = tmp_path / "iter_000300.json"
    path.write_text(json.dumps({**VERIFY, "protocol": "ckptflow.workflow-report.v2", "new_field": 1}))
    with pytest.raises(InvalidRecord, match="upgrade ckptflow") as raised:
        read_step_report(path, "report_verify")
    assert "fails schema" not in str(raised.value)
