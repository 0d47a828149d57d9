"""``ckptflow prune-verified``: release local payloads whose remote copy is proven (see ``archive/prune.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import ReportedFailure


def register(sub) -> None:
    s = sub.add_parser("prune-verified", help="free local payloads of artifacts whose remote copy is proven")
    s.add_argument("--paths", required=True, help="comma-separated artifact directories or model.pt files inside them")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS")
    s.add_argument("--dry-run", action="store_true", help="check everything, delete nothing, report what would go")
    s.add_argument("--read-data", action="store_true",
                   help="also download and hash every remote object before deleting (needed where the receipt "
                   "records no server checksum; always done for file://)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.prune import prune_verified
    from ..store.open import store_factory

    paths = [Path(p) for p in args.paths.split(",") if p.strip()]
    if not paths:
        raise UsageError("--paths is empty", remedy="name at least one artifact directory")
    report = prune_verified(paths, store_factory(args.credentials), dry_run=args.dry_run, read_data=args.read_data)
    out = report.to_report()
    if report.has_errors:
        bad = [k["path"] for k in report.kept if k.get("error")]
        raise ReportedFailure(out, f"inconsistent remote objects or failed checks for {bad}; those artifacts were kept")
    return out
