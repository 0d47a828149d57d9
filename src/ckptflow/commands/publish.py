"""``ckptflow publish``: archive a committed artifact; see ``archive/publish.py`` for the order of writes."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .summary import (
    block,
    destination_uri,
    files_bytes,
    held_text,
    human_bytes,
    inventory_total,
    is_record,
    payload_and_records,
    plural,
    records_in,
)


def register(sub) -> None:
    s = sub.add_parser("publish", help="archive an artifact under an immutable, digest-bound inventory")
    s.add_argument("--artifact-dir", required=True, help="checkpoint_artifacts/iter_N directory with a committed manifest")
    s.add_argument(
        "--upload-prefix",
        help="the run's <project>/<group>/<run>/<ts>/checkpoints (the artifact goes to the sibling "
        "checkpoint_artifacts/iter_N); default: derived from the artifact's path in the runs layout, which an "
        "explicit prefix must agree with",
    )
    s.add_argument(
        "--outside-runs-layout", action="store_true",
        help="the artifact's run tree is not laid out as <project>/<group>/<run>/<ts>: take --upload-prefix as given "
        "(it must still end in /checkpoints) instead of refusing one that differs from the prefix its path derives",
    )
    s.add_argument("--bucket", help="bucket name (S3) or s3://B, gs://B, file:///DIR; default $CKPTFLOW_BUCKET")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS")
    s.add_argument(
        "--delete-local", action="store_true",
        help="after verification, remove the local payload files (needs a passing probe of the endpoint)",
    )
    s.add_argument(
        "--stale-upload-age", default="24h",
        help="abort unfinished uploads under the artifact's prefix started longer ago than this, even where this "
        "machine's journal does not name them (90s, 30m, 24h, 7d; default 24h)",
    )
    s.add_argument(
        "--add-destination", action="store_true",
        help="the artifact's receipt names another destination: archive it here as well; the receipt then names "
        "this destination and keeps the earlier ones (without it, such a publication is refused)",
    )
    s.add_argument(
        "--dry-run", action="store_true",
        help="print the destination URI of every file, the bytes to send and what would be adopted or skipped; "
        "write nothing anywhere",
    )
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.keys import OVERRIDE, UnderivedPrefix
    from ..archive.publish import publish_artifact
    from ..errors import UsageError
    from ..store.open import open_bucket_arg
    from .gc_uploads import parse_age

    stale = parse_age(args.stale_upload_age)
    prefix = args.upload_prefix
    if args.outside_runs_layout:
        if prefix is None:
            raise UsageError(f"{OVERRIDE} takes --upload-prefix as given, but none was passed",
                             remedy="pass --upload-prefix <...>/checkpoints with it, or leave both out")
        prefix = UnderivedPrefix(prefix)
    store = open_bucket_arg(args.bucket, args.credentials)
    if args.dry_run:
        from ..archive.publish_plan import plan_publication

        return plan_publication(Path(args.artifact_dir), store, prefix, delete_local=args.delete_local,
                                add_destination=args.add_destination)
    result = publish_artifact(Path(args.artifact_dir), store, prefix, delete_local=args.delete_local,
                              stale_upload_age=stale, add_destination=args.add_destination)
    return result.to_report()


_HEADLINES = {
    "published": "published {what}; every remote object verified",
    "adopted": "adopted the identical archive already there ({what}); every remote object verified",
    "skipped": "already published: the receipt matches the archive ({what}); every remote object verified",
}


def _summarize_plan(report: dict[str, Any], elapsed: float | None) -> str:
    verb = {"published": "publish", "adopted": "adopt", "skipped": "skip"}[report["would"]]
    sends = [f for f in report["files"] if f["action"] == "send"]
    # the plan's files are the inventory and the declaration: every object of the archive
    what = payload_and_records(*inventory_total(report["inventory"]), records_in(report["files"]))
    head = (f"dry run: would {verb} {what}, sending {files_bytes(len(sends), report['bytes_to_send'], 'object')}; "
            "nothing was written")
    rows = [(f["action"], f"{f['uri']} ({human_bytes(f['size'])})") for f in report["files"]]
    if report.get("would_remove"):
        rows.append(("would remove", ", ".join(report["would_remove"])))
    return block(head, [("artifact", report["artifact_dir"]), ("archive", destination_uri(report["destination"])),
                        *rows], elapsed)


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    if report["status"] == "dry-run":
        return _summarize_plan(report, elapsed)
    # the inventory lists the payload files and the manifest; the declaration is the archive's other record
    what = payload_and_records(*inventory_total(report["inventory"]), records_in(report["inventory"]) + 1)
    # the part digests record goes with the payloads; the summary counts payload files only
    sizes = {e["path"]: e["size"] for e in report["inventory"]}
    record_bytes = sum(sizes.get(p, 0) for p in report["uploaded"] if is_record(p))
    uploaded = files_bytes(sum(1 for p in report["uploaded"] if not is_record(p)), report["uploaded_bytes"] - record_bytes)
    freed = files_bytes(len(report["removed"]), report["freed_bytes"]) if report["removed"] else None
    resumed = report.get("resumed_uploads") or []
    reused = sum(r["reused_bytes"] for r in resumed)
    resumed_row = (f"{plural(len(resumed), 'killed upload')}: {human_bytes(reused)} already stored, "
                   f"{human_bytes(report.get('sent_bytes', 0))} sent") if resumed else None
    aborted = report.get("aborted_uploads") or []
    aborted_row = ", ".join(f"{a['path']} ({a['reason']})" for a in aborted) or None
    return block(_HEADLINES[report["status"]].format(what=what), [
        ("artifact", report["artifact_dir"]),
        ("archive", destination_uri(report["destination"])),
        ("uploaded", uploaded),
        ("resumed", resumed_row),
        ("aborted", aborted_row),
        ("freed", freed),
        ("held", f"{held_text(report['held'])}: unlinked from the artifact, their bytes stay under those names "
                 "(nothing freed)" if report.get("held") else None),
    ], elapsed)
