"""``ckptflow gc-uploads``: abort unfinished multipart uploads under a prefix that are older than a bound
(killed publishes leave them; on AWS their parts are billed, on SeaweedFS they hold disk). An upload a
live process on this machine holds (see ``store/s3_uploads.py``) is never aborted, whatever its age.

What this front end decides (the sweep itself is ``S3Store.sweep_uploads``):

- scope: the prefix is whole path segments (``proj/run1`` is ``proj/run1/``). By default (``--scope run``)
  it must name at least ``<project>/<group>/<run>/``; a shorter prefix needs ``--scope prefix`` and the
  whole bucket (no prefix) ``--scope bucket``, so a typo never sweeps other runs or other tools' uploads;
- age: an upload of a live publisher on another host is not in this machine's journal; only its age
  (the server's ``Initiated`` against the server's ``Date``) protects it, so ``--older-than`` below
  ``MIN_OLDER_THAN`` is refused unless ``--force-age`` says every publisher of the prefix is known dead;
- a terminal run lists and aborts nothing unless ``--abort`` is given (a script's run, stdout not a
  terminal, aborts as before unless ``--dry-run``).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from ..errors import UsageError
from .summary import block, capped, human_bytes, plural

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

# Below this an upload may well belong to a publisher still running on another host.
MIN_OLDER_THAN = 3600.0
# Segments a prefix must have under the default scope: <project>/<group>/<run>/.
RUN_SEGMENTS = 3
SCOPES = ("run", "prefix", "bucket")


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
    s.add_argument("--prefix", default="",
                   help="key prefix as whole path segments (proj/g/run1 means proj/g/run1/, never proj/g/run10/)")
    s.add_argument("--scope", choices=SCOPES, default="run",
                   help="run (default): the prefix names at least <project>/<group>/<run>/; prefix: any shorter "
                   "non-empty prefix; bucket: no prefix, every upload in the bucket")
    s.add_argument("--older-than", default="24h",
                   help="abort only uploads the server says were started longer ago than this (90s, 30m, 24h, 7d; "
                   "default 24h). An upload of a live publisher on another host is not in this machine's journal: "
                   "this age, measured on the server's clock, is all that protects it, so keep it above the "
                   f"longest upload; below {MIN_OLDER_THAN / 3600:g}h it is refused without --force-age")
    s.add_argument("--force-age", action="store_true",
                   help=f"accept an --older-than below {MIN_OLDER_THAN / 3600:g}h (every publisher of the prefix is "
                   "known to be dead)")
    mode = s.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", default=None,
                      help="list what would be aborted, abort nothing (the default when stdout is a terminal)")
    mode.add_argument("--abort", dest="dry_run", action="store_false",
                      help="abort what is listed (the default when stdout is not a terminal)")
    s.set_defaults(func=run)


def check_scope(prefix: str, scope: str) -> str:
    """The prefix as whole segments, refused when it is broader than ``scope`` allows (or narrower than
    ``bucket``, which must name no prefix, so the flag always says what is swept)."""
    from ..store.uri import segment_prefix

    norm = segment_prefix(prefix, what="--prefix")
    depth = norm.count("/")
    if scope == "bucket":
        if norm:
            raise UsageError(f"--scope bucket sweeps the whole bucket but --prefix {prefix!r} was given",
                             remedy="drop --prefix, or drop --scope bucket to sweep only that prefix")
        return norm
    if not norm:
        raise UsageError("no --prefix: that would sweep every unfinished upload in the bucket, other tools' too",
                         remedy="give --prefix <project>/<group>/<run>/, or --scope bucket to mean the whole bucket")
    if scope == "run" and depth < RUN_SEGMENTS:
        raise UsageError(f"--prefix {norm!r} has {depth} segment(s), fewer than <project>/<group>/<run>/: it would "
                         "sweep other runs' uploads too",
                         remedy="name the run's prefix, or pass --scope prefix to sweep everything under it")
    return norm


def check_age(older_than: float, forced: bool) -> float:
    if older_than < MIN_OLDER_THAN and not forced:
        raise UsageError(f"--older-than {older_than:g} s is below {MIN_OLDER_THAN:g} s: an upload that young may "
                         "belong to a publisher still running on another host, which this machine cannot see",
                         remedy="raise --older-than, or pass --force-age once every publisher of the prefix "
                         "is known to be dead")
    return older_than


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..store.open import open_bucket_arg

    prefix = check_scope(args.prefix, args.scope)
    older_than = check_age(parse_age(args.older_than), args.force_age)
    dry_run = sys.stdout.isatty() if args.dry_run is None else args.dry_run
    store = open_bucket_arg(args.bucket, args.credentials)
    resumable = store.multipart.resumable if store.multipart is not None else None
    if resumable is None:
        raise UsageError(f"{store.destination.scheme}://{store.destination.bucket} keeps no multipart uploads "
                         "that ckptflow can list", remedy="gc-uploads works on S3 endpoints")
    aborted, kept = resumable.sweep_uploads(prefix, older_than=older_than, dry_run=dry_run)
    return {"status": "dry-run" if dry_run else "done", "destination": store.destination.as_dict(),
            "prefix": prefix, "scope": args.scope, "older_than_s": older_than, "aborted": aborted, "kept": kept}


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    aborted, kept = report["aborted"], report["kept"]
    dest = report["destination"]
    # The prefix as given, trailing slash kept: gc-uploads matches whole segments of a raw prefix, not a key.
    where = f"{dest['scheme']}://{dest['bucket']}/{report['prefix']} at {dest['endpoint']}"
    if report["status"] == "dry-run":
        headline = f"dry run: would abort {plural(len(aborted), 'unfinished upload')}; nothing was aborted"
        if aborted:
            headline += " (rerun with --abort to abort them)"
        verb = "would abort"
    else:
        headline = f"aborted {plural(len(aborted), 'unfinished upload')}"
        verb = "aborted"
    headline += f", {len(kept)} kept"
    rows = [(verb, f"{a['key']} ({_stored(a)})") for a in aborted]
    left = [("kept", f"{k['key']} ({_stored(k)}): {k['reason']}") for k in kept]
    return block(headline, [("under", where), *capped(rows, verb), *capped(left, "kept")], elapsed)


def _stored(row: dict[str, Any]) -> str:
    text = f"started {row['initiated']}"
    if "stored_bytes" in row:
        text += f", {plural(row['parts'], 'part')} stored, {human_bytes(row['stored_bytes'])}"
    return text
