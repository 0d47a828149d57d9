"""``ckptflow verify``: HEAD every object the artifact's receipt records (``--read-data``: hash contents too;
``--subset K/N``: one stable slice of the files; ``--all-under R``: every published artifact under R). A whole
check of one artifact is recorded in ``.verified.json`` beside the receipt (``ckptflow status`` shows it)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..records import RECEIPT_FILENAME
from . import ReportedFailure
from .summary import block, capped, destination_uri, human_bytes, is_record, plural


def subset_arg(text: str):
    from ..archive.verify import Subset

    try:
        return Subset.parse(text)
    except UsageError as exc:
        raise argparse.ArgumentTypeError(exc.message) from None


def register(sub) -> None:
    s = sub.add_parser("verify", help=f"check the remote copy recorded in an artifact's {RECEIPT_FILENAME} receipt")
    where = s.add_mutually_exclusive_group(required=True)
    where.add_argument("--artifact-dir", help="the published checkpoint_artifacts/iter_N directory")
    where.add_argument("--all-under", metavar="RUNS_ROOT",
                       help="scrub every published artifact under this runs root (implies --read-data)")
    s.add_argument("--destination", action="append", metavar="URI",
                   help="check only the copy at this destination of the receipt (repeatable; a URI such as "
                   "s3://BUCKET or s3://BUCKET/PREFIX); default: every destination the receipt lists")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS")
    s.add_argument("--read-data", action="store_true", help="also read back and hash every object (content-level check)")
    s.add_argument("--subset", type=subset_arg, metavar="K/N",
                   help="with --read-data: only the files in slice K of N (N runs, K=1..N, read every file once)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.scrub import scrub_runs_root
    from ..archive.verify import verify_artifact
    from ..store.open import store_factory

    if args.subset is not None and not (args.read_data or args.all_under):
        raise UsageError("--subset selects which files are read back; it needs --read-data",
                         remedy="pass --read-data --subset K/N (or --all-under R)")
    store_for = store_factory(args.credentials)
    if args.all_under:
        result = scrub_runs_root(Path(args.all_under), store_for, subset=args.subset, progress=None,
                                 destinations=args.destination)
    else:
        result = verify_artifact(Path(args.artifact_dir), store_for, read_data=args.read_data, subset=args.subset,
                                 progress=None, record=True, destinations=args.destination)
    report = result.to_report()
    if not result.ok:
        raise ReportedFailure(report, result.failure_line())
    return report


def _read_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    if not report["read_data"]:
        return []
    speed = f" at {report['throughput_mib_s']} MiB/s" if "throughput_mib_s" in report else ""
    rows = [("read", f"{human_bytes(report.get('bytes_read', 0))}{speed}")]
    return rows + ([("subset", report["subset"])] if report.get("subset") else [])


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    if "artifacts" in report:
        return _summarize_scrub(report, elapsed)
    others = report.get("other_destinations", [])
    objects = [*report["objects"], *(o for c in others for o in c["objects"])]
    bad = [o for o in objects if o["state"] != "ok"]
    how = "contents read and hashed" if report["read_data"] else "size and digests checked (HEAD)"
    copies = f" at {len(others) + 1} destinations" if others else ""
    if bad or report["status"] != "verified":
        headline = f"failed: {len(bad)} of {plural(len(objects), 'object')}{copies} not ok ({how})"
    else:
        records = sum(1 for o in report["objects"] if is_record(o["path"]))
        kinds = f"{plural(len(report['objects']) - records, 'payload file')}, {plural(records, 'record')}"
        headline = f"verified {plural(len(objects), 'object')} ({kinds}{' each' if others else ''}) of the archive{copies} ({how})"
    rows = [(o["state"], f"{o['path']}: {o['detail']}" if o.get("detail") else o["path"])
            for o in report["objects"] if o["state"] != "ok"]
    for other in others:
        where = destination_uri(other["destination"])
        rows += [("failed", f"{where}: {other['detail']}")] if other.get("detail") else []
        rows += [(o["state"], f"{where}: {o['path']}") for o in other["objects"] if o["state"] != "ok"]
    return block(headline, [
        ("artifact", report["artifact_dir"]),
        ("archive", destination_uri(report["destination"])),
        *[("also", destination_uri(c["destination"])) for c in others],
        *_read_rows(report),
        *capped(rows, "not ok"),
    ], elapsed)


def _summarize_scrub(report: dict[str, Any], elapsed: float | None) -> str:
    arts = report["artifacts"]
    bad = [a for a in arts if a["status"] == "failed"]
    read = [a for a in arts if a["status"] != "skipped"]
    headline = (f"failed: {len(bad)} of {plural(len(read), 'artifact')} not ok" if bad
                else f"scrubbed {plural(len(read), 'artifact')}: every object read back matches")
    rows = []
    for a in bad:
        objects = [o for o in a.get("objects", []) if o["state"] != "ok"]
        rows += [(o["state"], f"{a['artifact_dir']}/{o['path']}") for o in objects] or [("failed", a["artifact_dir"])]
    return block(headline, [("runs root", report["runs_root"]), *_read_rows(report), *capped(rows, "not ok")],
                 elapsed)
