"""``ckptflow ls URI``: the archived artifacts under a prefix, one row per run and iteration (``archive/listing.py``).

On a terminal an 80-column table grouped by run; piped, or with ``--json``, the JSON report.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from typing import Any

from .summary import files_bytes, human_bytes, plural


def register(sub) -> None:
    s = sub.add_parser("ls", help="archived artifacts under an s3://, gs:// or file:// prefix: committed or "
                       "incomplete, objects, bytes, when published, and with --runs-root the local copy")
    s.add_argument("uri", metavar="URI", help="s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or file:///DIR")
    s.add_argument("--runs-root", help="also show each artifact's local state under this runs root "
                   "(local, pruned, absent, ...)")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.listing import list_archive
    from ..errors import InvalidRecord, NotFound, UsageError
    from ..store.open import credentials_for, open_uri
    from ..store.uri import parse_store_uri

    try:
        uri = parse_store_uri(args.uri, what="URI")
    except InvalidRecord as exc:
        remedy = exc.remedy if "://" in args.uri else f"write it as {_URI_FORMS}{_meant(args.uri)}"
        raise UsageError(exc.message, remedy=remedy) from None
    store, _ = open_uri(uri, None, credentials_for(uri, args.credentials))
    try:
        store.require_bucket()
    except NotFound as exc:  # the store's remedy names publish's --bucket; ls takes the bucket in its URI
        what = "the archive root" if uri.scheme == "file" else "the bucket"
        form = "file:///DIR" if uri.scheme == "file" else f"{uri.scheme}://BUCKET/PREFIX"
        exc.add_context(remedy=f"create {what} first, or name the right one in the URI: ckptflow ls {form}"
                        + ("" if uri.scheme == "file" else " (the prefix is optional)"))
        raise
    listing = list_archive(store, uri)
    if args.runs_root:
        from ..status.listed import attach_local

        attach_local(listing, store.destination, Path(args.runs_root))
    return listing.to_report()


_URI_FORMS = "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or file:///DIR"


def _meant(text: str) -> str:
    """What a URI without a scheme most likely meant: a bucket name, or an absolute directory."""
    if ":" in text.split("/", 1)[0] or not text.strip("/"):
        return ""  # a scheme misspelt: no guess
    return f" (did you mean `ckptflow ls {'file://' if text.startswith('/') else 's3://'}{text}`?)"


_DASH = "—"


def _when(stamp: str | None) -> str:
    return stamp.replace("T", " ")[:16] if stamp else _DASH


def summarize(report: dict[str, Any], elapsed: float | None = None, width: int | None = None) -> str:
    """The table: a line per run (shortened in its middle to the terminal's width, as ``status`` does), then
    a line per iteration that fits 80 columns; details below it. An artifact's BYTES are its payload files'
    (``records.sizes``: what seal, publish and status print for it; "—" where no record declares them); the
    archive's objects (payload files and records) are counted in OBJECTS and in the headline."""
    from ..status.render import middle

    width = width or shutil.get_terminal_size().columns
    c = report["counts"]
    states = ", ".join(f"{c[s]} {s.replace('-', ' ')}" for s in
                       ("committed", "incomplete", "damaged", "legacy", "corrupt", "not-an-artifact") if c[s])
    lines = [f"{plural(c['artifacts'], 'artifact')} in {plural(c['runs'], 'run')} under {report['uri']}"
             + (f": {states}" if states else "") + "; "
             + files_bytes(sum(a["files"] or 0 for a in report["artifacts"]), report["bytes"])
             + f" as {files_bytes(sum(a['objects'] for a in report['artifacts']), sum(a['object_bytes'] for a in report['artifacts']), 'object')}"]
    local = report["runs_root"] is not None
    header = f"  {'ITERATION':<12}{'STATE':<16}{'OBJECTS':>8}{'BYTES':>10}  {'PUBLISHED UTC':<17}"
    rows, run = [], None
    for a in report["artifacts"]:
        if a["run"] != run:
            run = a["run"]
            rows.append(middle(run or "(no run)", width))
        when = _when(a["published_at"])
        line = f"  {a['name']:<12}{a['state']:<16}{a['objects']:>8}{_DASH if a['bytes'] is None else human_bytes(a['bytes']):>10}  {when:<17}"
        rows.append((line + (a["local"]["state"] if local else "")).rstrip())
    if rows:
        lines += [(header + ("LOCAL" if local else "")).rstrip(), *rows]
    other = report["other"]
    if other["objects"]:
        lines.append(f"{plural(other['objects'], 'other object')} ({human_bytes(other['bytes'])}) outside any "
                     f"checkpoint_artifacts/iter_N, not ckptflow archives (e.g. {', '.join(other['sample'][:2])})")
    notes = [f"  {a['run']} {a['name']}: {a['detail']}" for a in report["artifacts"] if a.get("detail")]
    notes += [f"  {a['run']} {a['name']} local: {a['local']['detail']}" for a in report["artifacts"]
              if a.get("local", {}).get("detail")]
    if notes:
        lines += ["details:", *notes]
    return "\n".join(lines)
