"""``ckptflow gc-uploads``: abort unfinished multipart uploads under a prefix that are older than a bound
(killed publishes leave them; on AWS their parts are billed, on SeaweedFS they hold disk). An upload a
live process on this machine holds (see ``store/s3_uploads.py``) is never aborted, whatever its age."""

from __future__ import annotations

import argparse
import re
from typing import Any

from ..errors import UsageError
from .summary import block, capped, plural

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_age(value: str) -> float:
    """``90`` or ``90s``, ``30m``, ``24h``, ``7d`` as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", value or "")
    if match is None:
        raise UsageError(f"age {value!r} is not a number with an optional unit s, m, h or d",
                         remedy="write it like 90s, 30m, 24h or 7d")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def register(sub) -> None:
    s = sub.add_parser("gc-uploads", help="abort unfinished multipart uploads under a prefix older than a bound")
    s.add_argument("--bucket", help="bucket name (S3) or s3://B; default $CKPTFLOW_BUCKET")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS")
    s.add_argument("--prefix", required=True, help="key prefix, e.g. <project>/<group>/<run>/ (ends with '/')")
    s.add_argument("--older-than", default="24h",
                   help="abort only uploads started longer ago than this (90s, 30m, 24h, 7d; default 24h)")
    s.add_argument("--dry-run", action="store_true", help="list what would be aborted, abort nothing")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..store.open import open_bucket_arg

    older_than = parse_age(args.older_than)
    store = open_bucket_arg(args.bucket, args.credentials)
    sweep = getattr(store, "sweep_uploads", None)
    if sweep is None:
        raise UsageError(f"{store.destination.scheme}://{store.destination.bucket} keeps no multipart uploads "
                         "that ckptflow can list", remedy="gc-uploads works on S3 endpoints")
    aborted, kept = sweep(args.prefix, older_than=older_than, dry_run=args.dry_run)
    return {"status": "dry-run" if args.dry_run else "done", "destination": store.destination.as_dict(),
            "prefix": args.prefix, "older_than_s": older_than, "aborted": aborted, "kept": kept}


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    aborted, kept = report["aborted"], report["kept"]
    dest = report["destination"]
    where = f"{dest['scheme']}://{dest['bucket']}/{report['prefix']} at {dest['endpoint']}"
    if report["status"] == "dry-run":
        headline = f"dry run: would abort {plural(len(aborted), 'unfinished upload')}; nothing was aborted"
        verb = "would abort"
    else:
        headline = f"aborted {plural(len(aborted), 'unfinished upload')}"
        verb = "aborted"
    headline += f", {len(kept)} kept"
    rows = [(verb, f"{a['key']} (started {a['initiated']})") for a in aborted]
    left = [("kept", f"{k['key']}: {k['reason']}") for k in kept]
    return block(headline, [("under", where), *capped(rows, verb), *capped(left, "kept")], elapsed)
