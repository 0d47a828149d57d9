"""``ckptflow verify``: HEAD every object the artifact's receipt records (``--read-data``: hash contents too)
and record the outcome in ``.verified.json`` beside the receipt (``ckptflow status`` shows it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import ReportedFailure
from .summary import block, capped, destination_uri, plural


def register(sub) -> None:
    s = sub.add_parser("verify", help="check the remote copy recorded in an artifact's .uploaded receipt")
    s.add_argument("--artifact-dir", required=True, help="the published checkpoint_artifacts/iter_N directory")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS")
    s.add_argument("--read-data", action="store_true", help="also download and hash every object (content-level check)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.verify import verify_artifact
    from ..store.open import store_factory

    result = verify_artifact(Path(args.artifact_dir), store_factory(args.credentials), read_data=args.read_data,
                             record=True)
    report = result.to_report()
    if not result.ok:
        raise ReportedFailure(report, result.failure_line())
    return report


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    objects = report["objects"]
    bad = [o for o in objects if o["state"] != "ok"]
    how = "contents read and hashed" if report["read_data"] else "size and digests checked (HEAD)"
    if bad:
        headline = f"failed: {len(bad)} of {plural(len(objects), 'object')} not ok ({how})"
    else:
        headline = f"verified {plural(len(objects), 'object')} of the archive ({how})"
    rows = [(o["state"], f"{o['path']}: {o['detail']}" if o.get("detail") else o["path"]) for o in bad]
    return block(headline, [
        ("artifact", report["artifact_dir"]),
        ("archive", destination_uri(report["destination"])),
        *capped(rows, "not ok"),
    ], elapsed)
