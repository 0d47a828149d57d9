"""One module per CLI verb. Each defines ``register(subparsers)``, which adds its parser and sets
``func`` to a function taking the parsed namespace and returning the JSON report (a dict).

A verb raises ``errors.CkptflowError`` subclasses for refusals and failures, or ``ReportedFailure``
when it has a full report but must still exit 1. ``cli.py`` owns output and exit codes.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import UsageError


class ReportedFailure(Exception):
    """A verb that produced a full report but must exit 1 (for example a failed probe)."""

    def __init__(self, report: dict[str, Any], line: str):
        super().__init__(line)
        self.report = report
        self.line = line


def env_default(name: str) -> str | None:
    return os.environ.get(name) or None


def open_store_from_args(bucket: str | None, credentials: str | None):
    """A store for ``--bucket`` (a name → S3, or an ``s3://``, ``gs://``, ``file://`` URI)."""
    from ..store import open_store_for_bucket

    bucket = bucket or env_default("CKPTFLOW_BUCKET")
    if not bucket:
        raise UsageError("no bucket given", remedy="pass --bucket or set CKPTFLOW_BUCKET")
    return open_store_for_bucket(bucket, credentials or env_default("CKPTFLOW_CREDENTIALS"))
