"""``ckptflow restore``: refill a pruned artifact's payloads in place, verified; see ``archive/restore.py``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import wait_seconds_arg
from .summary import block, destination_uri, files_bytes, plural


def register(sub) -> None:
    s = sub.add_parser("restore", help="refill a pruned artifact's payloads in place from the archive its receipt names")
    s.add_argument("--artifact-dir", required=True, help="the published checkpoint_artifacts/iter_N directory")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS (unused for file://)")
    s.add_argument("--destination", action="append", metavar="URI",
                   help="restore from the copy at this destination of the receipt (repeatable; a URI such as "
                   "s3://BUCKET or file:///ROOT/PREFIX); default: every destination the receipt lists, in its "
                   "order, until one serves")
    s.add_argument("--dry-run", action="store_true",
                   help="check everything and report what would be downloaded; write nothing anywhere")
    s.add_argument("--lock-wait-seconds", type=wait_seconds_arg, default=120.0, metavar="S",
                   help="how long to wait for another restore of the same artifact (iter_N.restore.lock) before "
                   "refusing (default 120; a finite number >= 0)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.restore import restore_artifact
    from ..store.open import store_factory

    result = restore_artifact(Path(args.artifact_dir), store_factory(args.credentials), dry_run=args.dry_run,
                              lock_wait_seconds=args.lock_wait_seconds,
                              destinations=tuple(args.destination) if args.destination else None)
    return result.to_report()


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    total = files_bytes(len(report["payloads"]), report["total_bytes"])
    missing = files_bytes(len(report["missing"]), report["missing_bytes"])
    if report["status"] == "already-local":
        headline = f"already local: {total}, every one re-hashed to its declared digest, nothing written"
    elif report["status"] == "dry-run":
        headline = f"dry run: would download {missing} (the artifact has {total}); nothing was written"
    else:
        headline = f"restored {missing} (the artifact has {total})"
    resumed = f", resumed {plural(len(report['resumed']), 'partial payload file')}" if report["resumed"] else ""
    return block(headline, [
        ("artifact", report["artifact_dir"]),
        ("from", report["source_uri"]),
        *[("skipped", f"{destination_uri(d['destination'])}: {d['detail']}") for d in report.get("skipped_destinations", ())],
        ("downloaded", files_bytes(len(report["downloaded"]), report["downloaded_bytes"]) + resumed
         if report["status"] == "restored" else None),
        ("kept", f"{plural(len(report['reused']), 'verified payload file')}" if report["reused"] else None),
    ], elapsed)
