"""Opening a store: the one place that turns ``--bucket``, ``--credentials``, the environment
(``CKPTFLOW_BUCKET``, ``CKPTFLOW_CREDENTIALS``) or a recorded ``Destination`` into an ``ObjectStore``.

Two levels. The front ends (commands, workflow) hand over the raw ``--credentials`` value (a path or
None): ``open_bucket_arg``, ``credentials_for`` and ``store_factory`` resolve it (flag, then
environment) and load it, only for a scheme that uses credentials: a ``file://`` store needs none, so a
missing or broken credentials file never matters for it (``_needs_credentials``, the one place that
says so). Everything below the front ends receives a loaded ``Credentials`` or None (None: the default
AWS chain for ``s3``) and opens with ``open_store``, ``open_uri`` or ``open_destination``.

* ``open_store("s3://bucket/prefix", creds)``: the store of the URI's bucket (the key part is the
  caller's prefix); ``open_store("s3", creds, bucket="b")`` the same from a scheme and a bucket;
  ``file:///dir`` makes ``dir`` the ``LocalStore`` root; ``gs://`` loads the GCS backend lazily.
* ``open_bucket_arg(bucket, credentials_arg)``: ``--bucket`` (a bare name means S3, or an ``s3://``,
  ``gs://``, ``file://`` URI), else ``$CKPTFLOW_BUCKET``; the bucket (or ``file://`` root) must exist
  (``require_bucket``), so publish, probe and gc-uploads refuse a missing one before any write.
* ``open_uri(uri, store, creds)``: the store holding a URI and the URI's key prefix in it, either a
  store the caller opened (refused when it does not hold the URI) or one opened from the URI.
* ``open_destination(destination, creds)``: reopen the store a receipt or probe record names, and
  ``check_destination``: the one check that a store is the one a record was written against.
* ``bounds=RequestBounds(...)`` (``open_store``, ``open_bucket_arg``): how long one request of the store
  may take at most, for a check that must answer in seconds whatever the endpoint does (``CHECK_BOUNDS``,
  the trainer's preflight); without it a store keeps its backend's defaults (S3: 8 attempts, botocore's
  60 s to connect and 60 s per read), made for transfers that must get through.

Every credentials file resolved and every store opened here notes where its credentials came from
(``CredentialsSource``: a path or botocore's method, never a key); ``credentials_used()`` is the latest
note of this process, which the CLI puts in every report (``forget_credentials_used()`` starts a
command afresh). A ``file://`` store notes nothing: it reads no credentials.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import Refused, UsageError
from .base import Destination, ObjectStore
from .credentials import (
    FROM_CHAIN,
    Credentials,
    CredentialsSource,
    load_credentials,
    resolve_credentials_source,
)
from .local import LocalStore
from .uri import SCHEMES, StoreURI, destination_label, parse_store_uri

BUCKET_ENV = "CKPTFLOW_BUCKET"


CredentialsArg = str | os.PathLike[str] | None  # the raw --credentials value


@dataclass(frozen=True)
class RequestBounds:
    """At most ``attempts`` tries of one request, each waiting at most ``connect_s`` to connect and
    ``read_s`` for each read of the answer (a server that accepts connections and never answers included)."""

    connect_s: float
    read_s: float
    attempts: int

    def worst_case_s(self) -> float:
        """The longest one request can take: every attempt timing out, and the longest backoff between them."""
        from .s3_retries import longest_backoff  # botocore's backoff; loaded only when asked

        return self.attempts * (self.connect_s + self.read_s) + longest_backoff(self.attempts)

    def s3_options(self) -> dict[str, Any]:
        return {"connect_timeout": self.connect_s, "read_timeout": self.read_s, "max_attempts": self.attempts}

    def gcs_options(self) -> dict[str, Any]:
        # GCS's own create-once requests (timeouts, attempts) and the S3-interop client it builds for the
        # rest (timeouts; its attempts stay the store's, under the caller's own deadline where it has one)
        return {"timeout": (self.connect_s, self.read_s), "max_attempts": self.attempts,
                "connect_timeout": self.connect_s, "read_timeout": self.read_s}


# A check before work (the trainer's preflight): a few seconds per request, whatever the endpoint does
# (21 s at worst: two attempts timing out after 5 s + 5 s, and at most 1 s of backoff between them).
CHECK_BOUNDS = RequestBounds(connect_s=5.0, read_s=5.0, attempts=2)

# Where the credentials of this process's latest store came from (see credentials_used).
_used: CredentialsSource | None = None


def _note(source: CredentialsSource | None) -> None:
    global _used
    if source is not None:
        _used = source


def credentials_used() -> CredentialsSource | None:
    """Where the credentials of the latest store opened (or credentials file resolved) came from; None
    when no store that reads credentials was opened since ``forget_credentials_used``."""
    return _used


def forget_credentials_used() -> None:
    """Start afresh: one command's report names only the credentials that command used."""
    global _used
    _used = None


def _needs_credentials(scheme: str) -> bool:
    return scheme != "file"  # a file:// archive is reached through the file system


def load_credentials_arg(arg: CredentialsArg) -> Credentials | None:
    """``--credentials``, else ``$CKPTFLOW_CREDENTIALS``, loaded and validated; None when neither is set."""
    source = resolve_credentials_source(arg)
    _note(source)  # before loading: a report of a missing or broken file still names it
    return load_credentials(source.path, source) if source is not None and source.path else None


def credentials_for(uri: str | StoreURI, arg: CredentialsArg) -> Credentials | None:
    """The credentials to open ``uri`` with: ``load_credentials_arg(arg)``, or None for a scheme that needs none."""
    scheme = uri.scheme if isinstance(uri, StoreURI) else uri.partition("://")[0]
    return load_credentials_arg(arg) if _needs_credentials(scheme) else None


def open_store(
    uri_or_scheme: str | StoreURI,
    credentials: Credentials | None = None,
    *,
    bucket: str | None = None,
    bounds: RequestBounds | None = None,
    **options: Any,
) -> ObjectStore:
    """The store for a URI (``s3://b/p``, ``gs://b/p``, ``file:///dir``) or for ``scheme`` + ``bucket``.

    ``options`` go to the backend's constructor (``part_size``, ``concurrency``, ...). ``file://``
    ignores any credentials given, and ``bounds`` (it makes no network request).
    """
    if isinstance(uri_or_scheme, StoreURI):
        scheme, name = uri_or_scheme.scheme, uri_or_scheme.bucket
    elif "://" in uri_or_scheme:
        parsed = parse_store_uri(uri_or_scheme)
        scheme, name = parsed.scheme, parsed.bucket
    else:
        scheme, name = uri_or_scheme, bucket
    if bucket is not None and bucket != name:
        raise UsageError(f"bucket {bucket!r} contradicts the URI's bucket {name!r}", remedy="pass one of them")
    if scheme not in SCHEMES:
        raise UsageError(f"unsupported store scheme {scheme!r}", remedy=f"use one of {', '.join(SCHEMES)}")
    if not name:
        raise UsageError(f"no bucket given for a {scheme} store", remedy="pass --bucket or a full URI")
    if scheme == "file":
        return LocalStore(parse_store_uri(f"file://{name}").bucket, **options)
    if credentials is not None:
        _note(credentials.origin)
    if scheme == "s3":
        from .s3 import S3Store  # botocore is loaded only when an S3 store is asked for

        if credentials is None:
            _note(CredentialsSource(FROM_CHAIN))  # named even when opening fails (partial keys)
        store = S3Store(name, credentials, **(bounds.s3_options() if bounds else {}), **options)
        if credentials is None:
            _note(CredentialsSource(FROM_CHAIN, method=store.credentials_method))
        return store
    from .gcs import GCSStore  # written separately; imported only when a gs:// store is asked for

    return GCSStore(name, credentials, **(bounds.gcs_options() if bounds else {}), **options)


def open_bucket_arg(bucket: str | None, credentials_arg: CredentialsArg, *, bounds: RequestBounds | None = None,
                    **options: Any) -> ObjectStore:
    """The store for ``--bucket`` (a name → S3, or an ``s3://``, ``gs://``, ``file://`` URI), else
    ``$CKPTFLOW_BUCKET``, with ``--credentials`` (else ``$CKPTFLOW_CREDENTIALS``) where the scheme uses them;
    refused (``NotFound``, naming it) when the bucket or ``file://`` root does not exist. ``bounds``: see
    ``open_store``."""
    bucket = bucket or os.environ.get(BUCKET_ENV) or None
    if not bucket:
        raise UsageError("no bucket given",
                         remedy=f"pass --bucket (a name, s3://B, gs://B or file:///DIR) or set {BUCKET_ENV}")
    uri = parse_store_uri(bucket, what="--bucket") if "://" in bucket else StoreURI("s3", bucket, "")
    if uri.key:
        raise UsageError(f"--bucket {bucket!r} names a key inside the bucket",
                         remedy="pass the bucket alone; keys come from --prefix")
    store = open_store(uri, credentials_for(uri, credentials_arg), bounds=bounds, **options)
    store.require_bucket()  # before any write: a server may create a missing bucket at the first PUT
    return store


def prefix_in(store: ObjectStore, uri: StoreURI) -> str:
    """The key prefix of ``uri`` in a store the caller opened; refuse a store that does not hold it.

    A ``file://`` store holds every directory below its root (see ``uri.py``).
    """
    dest = store.destination
    if uri.scheme == "file" and dest.scheme == "file":
        root = dest.endpoint.rstrip("/")
        if uri.bucket == root:
            return ""
        if uri.bucket.startswith(root + "/"):
            return uri.bucket[len(root) + 1:]
    elif (dest.scheme, dest.bucket) == (uri.scheme, uri.bucket):
        return uri.key
    raise UsageError(f"the store passed in ({dest.scheme}://{dest.bucket or dest.endpoint}) does not hold {uri}",
                     remedy="pass the store of the URI's bucket, or no store")


def open_uri(uri: StoreURI, store: ObjectStore | None = None,
             credentials: Credentials | None = None) -> tuple[ObjectStore, str]:
    """The store holding ``uri`` (``store`` if given, else one opened from the URI) and its key prefix there."""
    if store is not None:
        return store, prefix_in(store, uri)
    return open_store(uri, credentials), uri.key  # a file:// URI is its own root: key ""


def _open_recorded(destination: Destination, credentials: Credentials | None, **options: Any) -> ObjectStore:
    if destination.scheme == "file":  # the endpoint of a file:// destination is its root directory
        return open_store(StoreURI("file", destination.endpoint, ""), **options)
    return open_store(destination.scheme, credentials, bucket=destination.bucket, **options)


def check_destination(store: ObjectStore, recorded: Any, *, what: str) -> None:
    """Refuse a ``store`` other than the one ``recorded`` (scheme, endpoint, bucket) names; ``what`` is the record."""
    ours = store.destination
    if (ours.scheme, ours.endpoint, ours.bucket) != (recorded.scheme, recorded.endpoint, recorded.bucket):
        raise Refused(
            f"{what} is bound to {destination_label(recorded)}, but the credentials reach {destination_label(ours)}",
            remedy="pass the credentials of the endpoint the record was written against",
        )


def open_destination(destination: Destination, credentials: Credentials | None = None, *,
                     what: str = "the record", **options: Any) -> ObjectStore:
    """Reopen the store a receipt or probe record names; refuse credentials that reach another endpoint."""
    store = _open_recorded(destination, credentials, **options)
    check_destination(store, destination, what=what)
    return store


def store_factory(credentials_arg: CredentialsArg) -> Callable[[Destination], ObjectStore]:
    """``store_for(destination)`` for verify and prune: the store a receipt names, opened with the
    credentials of ``--credentials`` (else ``$CKPTFLOW_CREDENTIALS``), loaded when a destination needs them.

    The receipt supplies the scheme and bucket, the credentials the endpoint; the caller then refuses
    a mismatch with ``check_destination``, naming the receipt. A credentials file that cannot be read
    fails the opening of that one destination (prune keeps that artifact and says why).
    """

    def store_for(destination: Destination) -> ObjectStore:
        return _open_recorded(destination, credentials_for(f"{destination.scheme}://", credentials_arg))

    return store_for
