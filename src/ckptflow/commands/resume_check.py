"""``ckptflow resume-check``: the trainer's resume guard as a command (exit 0 may start, 1 refused or the
attempt directory does not exist). It only checks: under ``--resume off`` it names the fresh attempt the
trainer would mint and creates nothing."""

from __future__ import annotations

import argparse
from typing import Any

from . import ReportedFailure
from .summary import block


def register(sub) -> None:
    s = sub.add_parser("resume-check", help="may a training job start in this attempt directory, and from where")
    s.add_argument("--attempt-dir", required=True, help="the run's attempt directory <run>/<ts>")
    s.add_argument("--resume-path", help="an explicit checkpoint to resume from (directory or single file)")
    s.add_argument("--resume", choices=("auto", "off"), default="auto",
                   help="auto: resume from the newest resumable checkpoint (default); off: name the fresh attempt the "
                   "trainer would mint beside a non-empty one (nothing is created)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..trainer.resume import check_run_attempt

    decision = check_run_attempt(args.attempt_dir, args.resume, args.resume_path, must_exist=True)
    report = decision.to_report()
    if not decision.may_start:
        raise ReportedFailure(report, decision.message())
    return report


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    if report["status"] == "refused":
        head = f"refused: {report['reason']}"
        rows = [("attempt", report["original_attempt_dir"])] + [
            (f"remedy {i}", r) for i, r in enumerate(report["remedies"], 1)]
    else:
        head = {"fresh": "may start at step 0", "resume": "may resume"}[report["decision"]] + f": {report['reason']}"
        rows = [("attempt", report["attempt_dir"]), ("resume from", report["resume_from"])]
    rows.append(("newest artifact", report["newest_artifact"]))
    return block(head, rows, elapsed)
