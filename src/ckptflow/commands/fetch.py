"""``ckptflow fetch``: download an archived artifact into ``STAGE/iter_N``; see ``archive/reader.py``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(sub) -> None:
    s = sub.add_parser("fetch", help="download an archived artifact into a staging directory, verified and resumable")
    s.add_argument(
        "--artifact-uri", required=True,
        help="s3://B/.../checkpoint_artifacts/iter_N (also gs://B/... or file:///DIR/.../iter_N)",
    )
    s.add_argument("--dst", required=True, help="staging directory; the artifact lands in DST/iter_N (printed as 'path')")
    s.add_argument("--credentials", help="credentials JSON; default $CKPTFLOW_CREDENTIALS (unused for file://)")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ..archive.fetch import fetch_artifact
    from ..store.open import credentials_for

    credentials = credentials_for(args.artifact_uri, args.credentials)
    result = fetch_artifact(args.artifact_uri, Path(args.dst), credentials=credentials)
    return result.to_report()
