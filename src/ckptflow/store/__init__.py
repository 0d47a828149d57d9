"""Object stores: the ``ObjectStore`` protocol, URIs, credentials, and ``open_store``.

``open_store("s3://bucket/prefix", creds)`` returns the store for the URI's bucket (the key part is the
caller's prefix: ``parse_store_uri(uri).key``); ``open_store("s3", creds, bucket="b")`` does the same
from a scheme and a bucket. ``file://`` URIs name a directory that becomes the ``LocalStore`` root (see
``uri.py``). ``gs://`` loads the GCS backend lazily.
"""

from __future__ import annotations

from typing import Any

from ..errors import Refused, UsageError
from .base import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    Destination,
    ObjectInfo,
    ObjectStore,
)
from .credentials import Credentials, endpoint_authority, load_credentials, resolve_credentials_path
from .local import LocalStore
from .s3 import S3Store
from .uri import SCHEMES, StoreURI, parse_store_uri, validate_key, validate_prefix

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MULTIPART_THRESHOLD",
    "DEFAULT_PART_SIZE",
    "SCHEMES",
    "Credentials",
    "Destination",
    "LocalStore",
    "ObjectInfo",
    "ObjectStore",
    "S3Store",
    "StoreURI",
    "endpoint_authority",
    "load_credentials",
    "open_destination",
    "open_store",
    "parse_store_uri",
    "resolve_credentials_path",
    "validate_key",
    "validate_prefix",
]


def open_store(
    uri_or_scheme: str | StoreURI,
    credentials: Credentials | None = None,
    *,
    bucket: str | None = None,
    **options: Any,
) -> ObjectStore:
    """The store for a URI (``s3://b/p``, ``gs://b/p``, ``file:///dir``) or for ``scheme`` + ``bucket``.

    ``options`` go to the backend's constructor (``part_size``, ``concurrency``, ...).
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
    if scheme == "s3":
        return S3Store(name, credentials, **options)
    if scheme == "file":
        return LocalStore(parse_store_uri(f"file://{name}").bucket, **options)
    from .gcs import GCSStore  # written separately; imported only when a gs:// store is asked for

    return GCSStore(name, credentials, **options)


def open_destination(destination: Destination, credentials: Credentials | None = None, **options: Any) -> ObjectStore:
    """Reopen the store a receipt or probe record names; refuse credentials that point elsewhere."""
    if destination.scheme == "file":
        store = open_store(f"file://{destination.endpoint}", **options)
    else:
        store = open_store(destination.scheme, credentials, bucket=destination.bucket, **options)
    if store.destination.endpoint != destination.endpoint:
        raise Refused(
            f"the record names endpoint {destination.endpoint}, but the credentials point at "
            f"{store.destination.endpoint}",
            remedy="pass the credentials file for the endpoint the record was written against",
        )
    return store
