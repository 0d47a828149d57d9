"""``ckptflow seal``: commit a native manifest for components already written (``already-sealed``, exit 0,
when the directory's manifest records exactly these components and bytes)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .summary import block, files_bytes, plural


def register(sub) -> None:
    s = sub.add_parser("seal", help="commit a native manifest for components already written")
    s.add_argument("--artifact-dir", required=True, help="the iter_N directory holding the components")
    s.add_argument("--iteration", required=True, type=int, help="N; must match the directory name iter_N")
    s.add_argument("components", nargs="+", metavar="NAME=PATH", help="a file, or a directory taken as a DCP component")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..artifact import parse_component_spec, seal_or_confirm

    specs = [parse_component_spec(c) for c in args.components]
    record, already = seal_or_confirm(Path(args.artifact_dir), args.iteration, specs)
    files = record.physical_files()
    return {
        "status": "already-sealed" if already else "sealed",
        "artifact_dir": str(Path(args.artifact_dir).resolve()),
        "iteration": record.iteration,
        "components": sorted(record.components),
        "files": len(files),
        "total_bytes": sum(f.size for f in files),
    }


def summarize(report: dict[str, Any], elapsed: float | None) -> str:
    comps = report["components"]
    return block(
        f"{report['status'].replace('-', ' ')} iteration {report['iteration']}: {plural(len(comps), 'component')} ({', '.join(comps)}), "
        f"{files_bytes(report['files'], report['total_bytes'])}",
        [("artifact", report["artifact_dir"])], elapsed,
    )
