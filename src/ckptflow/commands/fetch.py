"""``ckptflow fetch``: download an archived artifact into ``STAGE/iter_N``; see ``archive/fetch.py``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..lock import DEFAULT_WAIT_SECONDS
from . import wait_seconds_arg
from .summary import block, files_bytes, inventory_total, plural, records_in


def register(sub) -> None:
    s = sub.add_parser("fetch", help="download an archived artifact into a staging directory, verified and resumable")
    s.add_argument(
        "--artifact-uri", required=True,
        help="s3://B/.../checkpoint_artifacts/iter_N (also gs://B/... or file:///DIR/.../iter_N)",
    )
    s.add_argument("--dst", required=True, help="staging directory; the artifact lands in DST/iter_N (printed as 'path')")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS (unused for file://)")
    s.add_argument("--lock-wait-seconds", type=wait_seconds_arg, default=DEFAULT_WAIT_SECONDS, metavar="S",
                   help="how long to wait for another fetch into the same DST/iter_N (DST/iter_N.lock) before "
                   f"refusing (default {DEFAULT_WAIT_SECONDS:g}; a finite number >= 0)")
    s.add_argument("--only", action="append", metavar="COMPONENT",
                   help="stage only this manifest component (repeatable; e.g. model, what materialize reads); "
                   "the record names the components, and a later fetch without --only downloads only the rest")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.fetch import fetch_artifact
    from ..store.open import credentials_for

    credentials = credentials_for(args.artifact_uri, args.credentials)
    result = fetch_artifact(args.artifact_uri, Path(args.dst), credentials=credentials,
                            lock_wait_seconds=args.lock_wait_seconds, components=args.only)
    return result.to_report()


_HEADLINES = {
    "fetched": "fetched iteration {it}: {what}",
    "resumed": "resumed this tool's earlier copy of iteration {it}: {what}",
    "already-staged": "already staged: iteration {it}, {what}, every file re-hashed to its digest, nothing written",
    "replaced": "replaced this tool's copy of another source, fetched iteration {it}: {what}",
}


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    what = files_bytes(*inventory_total(report["inventory"]))
    records = records_in(report["inventory"])
    what += f" + {plural(records, 'record')}" if records else ""
    if report["components"] is not None:
        what += f" ({', '.join(report['components'])} only)"
    reused = f", reused {plural(len(report['reused']), 'verified payload file')}" if report["reused"] else ""
    resumed = f", resumed {plural(len(report['resumed']), 'partial payload file')}" if report["resumed"] else ""
    beside = report["left_beside"]
    return block(_HEADLINES[report["status"]].format(it=report["iteration"], what=what), [
        ("from", report["source_uri"] + (" (legacy archive, no declaration)" if report["legacy"] else "")),
        ("to", report["path"]),
        ("downloaded", files_bytes(len(report["downloaded"]), report["downloaded_bytes"]) + reused + resumed),
        ("left beside", f"{plural(len(beside), 'file')} ckptflow did not write: {', '.join(beside)}" if beside else None),
    ], elapsed)
