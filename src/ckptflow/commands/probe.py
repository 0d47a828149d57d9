"""``ckptflow probe``: qualify an endpoint (create-once, races, metadata, checksums)."""

from __future__ import annotations

import argparse
from typing import Any

from . import ReportedFailure
from .summary import block, destination_uri


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


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    where, res = destination_uri(report["destination"]), report["results"]
    if report["status"] == "passed":
        headline = f"passed: {where} enforces create-once; every check held"
    else:
        headline = f"failed: {where} does not qualify; publication to it fails closed"
    return block(headline, [
        *(("reason", r) for r in report["reasons"]),
        ("create-once", "second write refused" if res["create_once_refused_second_write"] else "second write ACCEPTED"),
        ("race", f"{res['concurrent_winners']} of {res['concurrent_creators']} creators won"),
        ("sha256 meta", "round-trips" if res["sha256_metadata_roundtrip"] else "LOST on HEAD"),
        ("checksum", res["checksum_sha256"]),
        ("record", report["record"]),
    ], elapsed)
