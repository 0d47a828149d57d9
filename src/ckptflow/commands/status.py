"""``ckptflow status``: one row per run and iteration, read from the records (see ``status/``).

On a terminal the human form is the table (``summarize``), fitted to the terminal's width (``COLUMNS``,
else the terminal's own size), or every column in full with ``--wide``; piped, or with ``--json``, the
JSON report, as for every verb.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from ..records import MATERIALIZED_FILENAME, STAGING_FILENAME
from . import ReportedFailure


def register(sub) -> None:
    s = sub.add_parser("status", help="one row per run and iteration: committed, merged, published, verified, "
                       "pruned, staged, materialized, with local and archived sizes")
    s.add_argument("root", metavar="RUNS_ROOT_OR_RUN_DIR",
                   help="a runs root (every <project>/<group>/<run>/<ts> below it) or one run directory")
    s.add_argument("--verify", action="store_true",
                   help="HEAD-check every receipt's objects in the store now (the only option that contacts it)")
    s.add_argument("--reports-dir", help="the workflow's reports_dir: read verify/<run>/iter_N.json and "
                   "prune/<run>/iter_N.json")
    s.add_argument("--stage-dir", help=f"the workflow's stage_dir: read <run>/iter_N/{STAGING_FILENAME}")
    s.add_argument("--teachers-dir", help=f"the workflow's teachers_dir: read <run>/iter_N/{MATERIALIZED_FILENAME}")
    s.add_argument("--credentials", help="credentials JSON for --verify; default $CKPTFLOW_CREDENTIALS")
    s.add_argument("--wide", action="store_true", help="on a terminal, every column in full (paths, timestamps, "
                   "sizes) however wide the table gets")
    s.set_defaults(func=run)


def summarize(report: dict[str, Any], elapsed: float | None = None, args: argparse.Namespace | None = None) -> str:
    """The human form of a status report: the table that fits the terminal, or in full with ``--wide``."""
    from ..status import render_report

    wide = bool(args is not None and getattr(args, "wide", False))
    return render_report(report, width=None if wide else shutil.get_terminal_size().columns).rstrip("\n")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..status import collect_status
    from ..store.open import store_factory

    def opt(value: str | None) -> Path | None:
        return Path(value) if value else None

    status = collect_status(Path(args.root), reports_dir=opt(args.reports_dir), stage_dir=opt(args.stage_dir),
                            teachers_dir=opt(args.teachers_dir),
                            verify_with=store_factory(args.credentials) if args.verify else None)
    report = status.to_report()
    if status.live_failures:
        raise ReportedFailure(report, status.failure_line())
    return report
