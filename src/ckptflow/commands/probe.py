"""``ckptflow probe``: qualify an endpoint (create-once, races, metadata, checksums)."""

from __future__ import annotations

import argparse
from typing import Any

from . import ReportedFailure


def register(sub) -> None:
    s = sub.add_parser("probe", help="qualify an endpoint: create-once, races, metadata, checksums")
    s.add_argument("--bucket", help="bucket name (S3) or s3://B, gs://B, file:///DIR; default $CKPTFLOW_BUCKET")
    s.add_argument("--prefix", required=True, help="scratch keys go under PREFIX/.ckptflow-probe/ and are removed")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS")
    s.add_argument("--creators", type=_at_least_two, default=8, help="concurrent creators in the race check (default 8, at least 2)")
    s.set_defaults(func=run)


def _at_least_two(text: str) -> int:
    value = int(text)
    if value < 2:
        raise argparse.ArgumentTypeError("a race needs at least 2 creators")
    return value


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.probe import run_probe
    from ..records.probe import probe_record_path
    from ..store.open import open_bucket_arg

    store = open_bucket_arg(args.bucket, args.credentials)
    outcome = run_probe(store, args.prefix, creators=args.creators)
    rec = outcome.record
    dest = rec.destination.to_dict()
    report = {
        "status": "passed" if rec.passed else "failed",
        "destination": dest,
        "prefix": rec.prefix,
        "results": rec.results.to_dict(),
        "reasons": outcome.reasons,
        "record": str(probe_record_path(dest)),
    }
    if not rec.passed:
        raise ReportedFailure(
            report,
            f"endpoint {dest['endpoint']} (bucket {dest['bucket']!r}) does not qualify: "
            + "; ".join(outcome.reasons)
            + "; publication to it fails closed — use an endpoint that enforces create-once",
        )
    return report
