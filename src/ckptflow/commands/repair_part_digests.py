"""``ckptflow repair-part-digests``: put an archive's part digests record back from the artifact's local copy;
see ``archive/repair.py``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .summary import block, destination_uri


def register(sub) -> None:
    s = sub.add_parser("repair-part-digests",
                       help="put a missing or damaged .posttrain-part-digests.json back in the archive from the "
                       "artifact's local copy, when that copy is the one the declaration binds")
    s.add_argument("--artifact-dir", required=True, help="the published checkpoint_artifacts/iter_N directory")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS (unused for file://)")
    s.add_argument("--destination", action="append", metavar="URI",
                   help="repair only the copy at this destination of the receipt (repeatable; a URI such as "
                   "s3://BUCKET or file:///ROOT/PREFIX); default: every destination the receipt lists")
    s.add_argument("--dry-run", action="store_true",
                   help="check everything and report what would be put back; write nothing anywhere")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.repair import repair_part_digests
    from ..store.open import store_factory

    result = repair_part_digests(Path(args.artifact_dir), store_factory(args.credentials), dry_run=args.dry_run,
                                 destinations=tuple(args.destination) if args.destination else None)
    return result.to_report()


_HEADLINES = {
    "repaired": "put {record} back at {n} of {total} destination(s) from the local copy",
    "intact": "{record} is intact at every destination checked ({total}); nothing written",
    "dry-run": "dry run: would put {record} back at {n} of {total} destination(s); nothing was written",
}


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    rows = report["destinations"]
    todo = [d for d in rows if d["state"] in ("missing", "damaged")]
    headline = _HEADLINES[report["status"]].format(record=report["record"], n=len(todo), total=len(rows))
    return block(headline, [
        ("artifact", report["artifact_dir"]),
        ("local copy", report["local_copy"] if todo else None),
        *[(d["state"] + (", put back" if d["repaired"] else ""), destination_uri(d["destination"])
           + (f" ({d['detail']})" if d.get("detail") else "")) for d in rows],
    ], elapsed)
