"""``ckptflow status``: one row per run and iteration, read from the records (see ``status.py``).

On a terminal without ``--json`` the verb prints the table itself (``human``) and exits here: cli.py
has no hook for a human form yet, and printing the JSON report after the table would defeat both.
Elsewhere, or with ``--json``, cli.py prints the JSON report as for every verb.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from . import ReportedFailure


def register(sub) -> None:
    s = sub.add_parser("status", help="one row per run and iteration: committed, merged, published, verified, "
                       "pruned, staged, materialized, with local and archived sizes")
    s.add_argument("root", metavar="RUNS_ROOT_OR_RUN_DIR",
                   help="a runs root (every <project>/<group>/<run>/<ts> below it) or one run directory")
    s.add_argument("--json", action="store_true", help="print the JSON report even on a terminal")
    s.add_argument("--verify", action="store_true",
                   help="HEAD-check every receipt's objects in the store now (the only option that contacts it)")
    s.add_argument("--reports-dir", help="the workflow's reports_dir: read verify/<run>/iter_N.json and "
                   "prune/<run>/iter_N.json")
    s.add_argument("--stage-dir", help="the workflow's stage_dir: read <run>/iter_N/.staged.json")
    s.add_argument("--teachers-dir", help="the workflow's teachers_dir: read <run>/iter_N/.materialized")
    s.add_argument("--credentials", help="credentials JSON for --verify; default $CKPTFLOW_CREDENTIALS")
    s.set_defaults(func=run)


def human(report: dict[str, Any]) -> str:
    """The human form of a status report: the aligned table."""
    from ..status import render_report

    return render_report(report)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..status import collect_status
    from ..store.open import store_factory

    def opt(value: str | None) -> Path | None:
        return Path(value) if value else None

    status = collect_status(Path(args.root), reports_dir=opt(args.reports_dir), stage_dir=opt(args.stage_dir),
                            teachers_dir=opt(args.teachers_dir),
                            verify_with=store_factory(args.credentials) if args.verify else None)
    report = status.to_report()
    if not args.json and sys.stdout.isatty():
        sys.stdout.write(human(report))
        sys.stdout.flush()
        if status.live_failures:
            sys.stderr.write(f"ckptflow status: {status.failure_line()}\n")
        raise SystemExit(1 if status.live_failures else 0)
    if status.live_failures:
        raise ReportedFailure(report, status.failure_line())
    return report
