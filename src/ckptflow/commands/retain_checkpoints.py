"""``ckptflow retain-checkpoints``: keep ``latest`` and the last N full checkpoints; see ``trainer/retention.py``."""

from __future__ import annotations

import argparse
from typing import Any

from .summary import block, capped, human_bytes, plural


def register(sub) -> None:
    s = sub.add_parser("retain-checkpoints", help="delete uploaded full checkpoints older than the last N")
    s.add_argument("--run-dir", required=True, help="the attempt directory <run>/<ts> holding checkpoints/")
    s.add_argument("--keep-last", required=True, type=int, help="how many of the newest resumable checkpoints to keep")
    s.add_argument("--dry-run", action="store_true", help="report what would go, delete nothing")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..trainer.retention import retain_checkpoints

    return retain_checkpoints(args.run_dir, args.keep_last, dry_run=args.dry_run).to_report()


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    """What was removed (path and size) first, then what was kept and why."""
    verb = "would remove" if report["dry_run"] else "removed"
    sizes = report.get("removed_bytes", {})
    gone = [(verb, f"{p} ({human_bytes(sizes[p])})" if p in sizes else p) for p in report["removed"]]
    return block(
        f"{verb} {plural(len(report['removed']), 'checkpoint')} ({human_bytes(report['freed_bytes'])}), "
        f"kept {len(report['kept'])}",
        [("run", report["run_dir"]), ("latest", report["latest"]), *capped(gone, verb),
         *capped([("kept", f"{k['path']}: {k['reason']}") for k in report["kept"]], "kept")], elapsed,
    )
