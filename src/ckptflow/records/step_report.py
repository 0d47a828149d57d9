"""The workflow's step reports of publish, verify and prune: the rule outputs ``status`` and the planning
read back, so they are records as much as reports::

    <reports_dir>/publish/<run>/iter_N.json         the verb's report (schemas/report_publish.schema.json)
    <reports_dir>/legacy-receipt/<run>/iter_N.json    with the workflow's fields: "protocol":
    <reports_dir>/verify/<run>/iter_N.json          "ckptflow.workflow-report.v1", "batch" (the batch job
    <reports_dir>/prune/<run>/iter_N.json           whose outcome it is), "publication" or "round" (the
    <reports_dir>/prune/keep-free.json              rule's rerun trigger)

Each is validated against its verb's schema when written, so a field the schema does not name never
reaches a reader. ``protocol`` is checked by name before the schema, as a record's is: a report of a newer
ckptflow is refused with "upgrade ckptflow", not a schema error; a report without one (written before the
field existed, or a verb's report saved by hand) is read as its schema allows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..fsutil import atomic_write_bytes
from ..jsonio import decode_json_object, encode_json, validate
from . import _record

PROTOCOL = "ckptflow.workflow-report.v1"


def _kind(schema: str) -> _record.RecordKind:
    return _record.RecordKind(filename="step report", schema=schema, protocol=PROTOCOL,
                              legacy_remedy="run the step again with this ckptflow (remove the report)")


def encode_step_report(report: Mapping[str, Any], schema: str, *, what: str) -> bytes:
    """The report's bytes with the protocol, after the checks ``read_step_report`` runs on them."""
    data = {**report, "protocol": PROTOCOL}
    validate(data, schema, what=what)
    return encode_json(data)


def write_step_report(path: Path | str, report: Mapping[str, Any], schema: str) -> dict[str, Any]:
    """Validate ``report`` against ``schema`` and write it atomically at ``path``; the report as written."""
    path = Path(path)
    data = encode_step_report(report, schema, what=str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)
    return {**report, "protocol": PROTOCOL}


def read_step_report(path: Path | str, schema: str) -> dict[str, Any]:
    """The step report at ``path``: its protocol (when it has one) checked by name, then its schema."""
    what = str(path)
    report = decode_json_object(_record.read_bytes(Path(path), what), what=what)
    if "protocol" in report:
        _record.check_protocol(_kind(schema), report, what)
    validate(report, schema, what=what)
    return report
