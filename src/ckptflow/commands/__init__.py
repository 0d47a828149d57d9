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


def _credentials(arg: str | None):
    """``--credentials``, else ``$CKPTFLOW_CREDENTIALS``, loaded; None when neither is set."""
    from ..store.credentials import load_credentials, resolve_credentials_path

    path = resolve_credentials_path(arg)
    return load_credentials(path) if path else None


def open_store_from_args(bucket: str | None, credentials: str | None):
    """A store for ``--bucket`` (a name → S3, or an ``s3://``, ``gs://``, ``file://`` URI)."""
    from ..store import open_store
    from ..store.uri import StoreURI, parse_store_uri

    bucket = bucket or env_default("CKPTFLOW_BUCKET")
    if not bucket:
        raise UsageError("no bucket given", remedy="pass --bucket (a name, s3://B, gs://B or file:///DIR) or set CKPTFLOW_BUCKET")
    uri = parse_store_uri(bucket, what="--bucket") if "://" in bucket else StoreURI("s3", bucket, "")
    if uri.key:
        raise UsageError(f"--bucket {bucket!r} names a key inside the bucket", remedy="pass the bucket alone; keys come from --prefix")
    return open_store(uri, _credentials(credentials) if uri.scheme != "file" else None)


def store_factory(credentials: str | None):
    """``store_for(destination)``: open the store a receipt names, with the caller's credentials.

    The receipt supplies the scheme and bucket; the endpoint comes from the credentials, and callers
    then check that it equals the receipt's (``archive.verify.check_destination``).
    """
    from ..store import open_store
    from ..store.uri import StoreURI

    def store_for(destination):
        if destination.scheme == "file":
            return open_store(StoreURI("file", destination.endpoint, ""), None)
        return open_store(StoreURI(destination.scheme, destination.bucket, ""), _credentials(credentials))

    return store_for
