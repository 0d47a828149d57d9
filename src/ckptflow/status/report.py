"""The status of a runs root as data: a ``Row`` per (run, iteration) of ``cell`` dicts, and the
``StatusReport`` that counts them and becomes the ``status`` report (schemas/report_status.schema.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NONE, CORRUPT = "none", "corrupt"


def cell(state: str, detail: str | None = None, **fields: Any) -> dict[str, Any]:
    """One column of a row: its ``state``, a ``detail`` only when something needs explaining, and data."""
    out = {"state": state, **{k: v for k, v in fields.items() if v is not None}}
    if detail:
        out["detail"] = detail
    return out


@dataclass
class Row:
    """The state of one iteration of one run; every column is a ``cell`` dict."""

    run: str
    iteration: int
    name: str
    artifact_dir: Path | None = None
    local: dict[str, Any] = field(default_factory=lambda: cell("absent"))
    merged: dict[str, Any] = field(default_factory=lambda: cell(NONE))
    published: dict[str, Any] = field(default_factory=lambda: cell(NONE))
    verified: dict[str, Any] = field(default_factory=lambda: cell(NONE))
    pruned: dict[str, Any] = field(default_factory=lambda: cell(NONE))
    staged: dict[str, Any] = field(default_factory=lambda: cell(NONE))
    materialized: dict[str, Any] = field(default_factory=lambda: cell(NONE))
    local_bytes: int | None = None
    archived_bytes: int | None = None
    receipt_mtime: float | None = field(default=None, repr=False)
    receipt_sha256: str | None = field(default=None, repr=False)
    manifest_sha256: str | None = field(default=None, repr=False)  # the committed local manifest's digest
    # The model digests to compare: the local manifest's and the one the teacher was built from.
    model_sha256: str | None = field(default=None, repr=False)
    teacher_sha256: str | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "iteration": self.iteration,
            "name": self.name,
            "artifact_dir": str(self.artifact_dir) if self.artifact_dir is not None else None,
            **{column: getattr(self, column) for column in COLUMNS},
            "local_bytes": self.local_bytes,
            "archived_bytes": self.archived_bytes,
        }


COLUMNS = ("local", "merged", "published", "verified", "pruned", "staged", "materialized")


@dataclass
class StatusReport:
    root: Path
    rows: list[Row]
    reports_dir: Path | None = None
    stage_dir: Path | None = None
    teachers_dir: Path | None = None
    live: bool = False

    @property
    def live_failures(self) -> list[Row]:
        """Rows whose live verification (``--verify``) failed or could not run."""
        return [r for r in self.rows if r.verified.get("source") == "live" and r.verified["state"] != "verified"]

    def counts(self) -> dict[str, int]:
        def n(column: str, *states: str) -> int:
            return sum(getattr(r, column)["state"] in states for r in self.rows)

        return {
            "iterations": len(self.rows),
            "runs": len({r.run for r in self.rows}),
            "committed": n("local", "committed"),
            "incomplete": n("local", "incomplete"),
            "merged": n("merged", "merged"),
            "published": n("published", "receipt"),
            "legacy_receipts": n("published", "legacy-receipt"),
            "verified": sum(r.verified["state"] == "verified" and not r.verified.get("stale") for r in self.rows),
            "pruned": n("pruned", "pruned"),
            "staged": n("staged", "staged"),
            "materialized": n("materialized", "materialized"),
            "attention": sum(any(getattr(r, c).get("detail") for c in COLUMNS) for r in self.rows),
        }

    def to_report(self) -> dict[str, Any]:
        """The ``status`` report (schemas/report_status.schema.json)."""

        def opt(path: Path | None) -> str | None:
            return str(path) if path is not None else None

        return {
            "status": "failed" if self.live_failures else "ok",
            "root": str(self.root),
            "reports_dir": opt(self.reports_dir),
            "stage_dir": opt(self.stage_dir),
            "teachers_dir": opt(self.teachers_dir),
            "verify_live": self.live,
            "counts": self.counts(),
            "local_bytes": sum(r.local_bytes or 0 for r in self.rows),
            "archived_bytes": sum(r.archived_bytes or 0 for r in self.rows),
            "rows": [r.to_dict() for r in self.rows],
        }

    def render(self) -> str:
        from .render import render_report

        return render_report(self.to_report())

    def failure_line(self) -> str:
        bad = [f"{r.run} {r.name}: {r.verified['state']}" for r in self.live_failures]
        return (f"{len(bad)} artifact(s) failed live verification ({'; '.join(bad[:5])}); "
                "see each row's verified.detail, and keep the local copies")
