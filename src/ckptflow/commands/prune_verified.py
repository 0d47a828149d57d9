"""``ckptflow prune-verified``: release local payloads whose remote copy is proven (see ``archive/prune.py``);
with ``--runs-root R --keep-free SIZE``, oldest first until R's file system has SIZE free (``archive/keep_free.py``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..errors import UsageError
from . import ReportedFailure
from .summary import block, capped, files_bytes, held_text, human_bytes, plural


def register(sub) -> None:
    s = sub.add_parser("prune-verified", help="free local payloads of artifacts whose remote copy is proven")
    which = s.add_mutually_exclusive_group(required=True)
    which.add_argument("--paths", nargs="+", metavar="PATH",
                       help="artifact directories or model.pt files inside them, as separate arguments (shell globs "
                       "work) or comma-separated")
    which.add_argument("--runs-root", metavar="R", help="free verified artifacts under R, oldest first, until its "
                       "file system has --keep-free free")
    s.add_argument("--keep-free", metavar="SIZE|PCT", help="with --runs-root: the free space to reach, e.g. 20G "
                   "(binary units; a bare number is refused) or 15%% of the file system")
    s.add_argument("--keep-newest", type=int, metavar="K", help="with --runs-root: never free the newest K artifacts "
                   "of a run (default 1)")
    s.add_argument("--destination", action="append", metavar="URI",
                   help="rely on the copy at this destination of the receipt (repeatable; a URI such as "
                   "s3://BUCKET or s3://BUCKET/PREFIX); default: every destination the receipt lists must verify")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS")
    s.add_argument("--dry-run", action="store_true", help="check everything, write and delete nothing anywhere (an endpoint without a cached probe "
                   "record is not probed: the report says the real run would probe it), report what would go")
    s.add_argument("--read-data", action="store_true",
                   help="also download and hash every remote object before deleting (needed where the receipt "
                   "records no server checksum; always done for file://)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.prune import prune_verified
    from ..store.open import store_factory

    if args.runs_root is not None:
        report = _keep_free(args, store_factory(args.credentials))
    else:
        if args.keep_free is not None or args.keep_newest is not None:
            raise UsageError("--keep-free and --keep-newest go with --runs-root, not --paths",
                             remedy="pass --runs-root R --keep-free SIZE, or --paths alone")
        paths = [Path(p) for arg in args.paths for p in arg.split(",") if p.strip()]
        if not paths:
            raise UsageError("--paths is empty", remedy="name at least one artifact directory")
        report = prune_verified(paths, store_factory(args.credentials), dry_run=args.dry_run, read_data=args.read_data,
                                destinations=_destinations(args))
    out = report.to_report()
    if report.has_errors:
        bad = [k for k in report.kept if k.get("error")]
        raise ReportedFailure(out, f"kept {plural(len(bad), 'path')} that cannot be released: "
                              + "; ".join(_kept(k) for k in bad[:3])
                              + (f"; … {len(bad) - 3} more (see the report)" if len(bad) > 3 else ""))
    return out


def _keep_free(args: argparse.Namespace, store_for):
    from ..archive.keep_free import keep_free, parse_target

    if args.keep_free is None:
        raise UsageError("--runs-root needs --keep-free", remedy="pass e.g. --keep-free 20G or --keep-free 15%")
    return keep_free(Path(args.runs_root), parse_target(args.keep_free), store_for,
                     keep_newest=1 if args.keep_newest is None else args.keep_newest,
                     dry_run=args.dry_run, read_data=args.read_data, destinations=_destinations(args))


def _kept(entry: dict[str, Any]) -> str:
    """A kept artifact and why, its path said once (most reasons already name it)."""
    return entry["reason"] if entry["path"] in entry["reason"] else f"{entry['path']}: {entry['reason']}"


def _destinations(args: argparse.Namespace) -> tuple[str, ...] | None:
    return tuple(args.destination) if args.destination else None


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    removed, kept = report["removed"], report["kept"]
    n_files = sum(len(r["files"]) for r in removed)
    freed = f"{human_bytes(report['freed_bytes'])} ({plural(n_files, 'payload file')} of {plural(len(removed), 'artifact')})"
    if report["dry_run"]:
        would = f"would free {freed}" if removed else "nothing would be freed"
        headline = f"dry run: {would}, {plural(len(kept), 'artifact')} kept; nothing was deleted"
    else:
        headline = f"{f'freed {freed}' if removed else 'nothing freed'}, {plural(len(kept), 'artifact')} kept"
    if report["status"] == "failed":
        headline = f"failed: {headline}"
    target = report.get("keep_free")
    if target is not None:
        after = "would have" if report["dry_run"] else "has"
        headline += (f"; {target['runs_root']} had {human_bytes(target['free_before'])} free and {after} "
                     f"{human_bytes(target['free_after'])} (target {target['target']}: "
                     f"{'met' if target['met'] else 'NOT met'})")
    verb = "would remove" if report["dry_run"] else "removed"
    gone = [(verb, f"{r['path']} ({files_bytes(len(r['files']), r['bytes'])})"
             + (f"; {r['needs']}" if r.get("needs") else "")) for r in removed]
    left = [("kept", _kept(k)) for k in kept]
    held = [("held", f"{r['path']}: {held_text(r['held'])}: unlinked from the artifact, its bytes stay under "
             "those names (nothing freed)") for r in removed if r.get("held")]
    return block(headline, [*capped(gone, verb), *capped(held, "held"), *capped(left, "kept")], elapsed)
