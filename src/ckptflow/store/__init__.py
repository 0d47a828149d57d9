"""Object stores: the ``ObjectStore`` protocol and its capabilities, URIs, credentials, and opening a store.

Opening a store (from ``--bucket``, ``--credentials``, the environment or a recorded destination) is
decided in ``open.py`` alone; this package re-exports its entry points.
"""

from __future__ import annotations

from .base import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MULTIPART_THRESHOLD,
    DEFAULT_PART_SIZE,
    Destination,
    DownloadShape,
    MultipartUploads,
    ObjectInfo,
    ObjectStore,
    ResumableUploads,
    StoreCapabilities,
)
from .credentials import Credentials, endpoint_authority, load_credentials, resolve_credentials_path
from .local import LocalStore
from .open import load_credentials_arg, open_bucket_arg, open_destination, open_store, store_factory
from .uri import SCHEMES, StoreURI, parse_store_uri, validate_key, validate_prefix

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_MULTIPART_THRESHOLD",
    "DEFAULT_PART_SIZE",
    "SCHEMES",
    "Credentials",
    "Destination",
    "DownloadShape",
    "LocalStore",
    "MultipartUploads",
    "ObjectInfo",
    "ObjectStore",
    "ResumableUploads",
    "S3Store",
    "StoreCapabilities",
    "StoreURI",
    "endpoint_authority",
    "load_credentials",
    "load_credentials_arg",
    "open_bucket_arg",
    "open_destination",
    "open_store",
    "parse_store_uri",
    "resolve_credentials_path",
    "store_factory",
    "validate_key",
    "validate_prefix",
]


def __getattr__(name: str):
    # botocore is loaded only when an S3 store is asked for: planning, status and file:// stores never pay it.
    if name == "S3Store":
        from .s3 import S3Store

        return S3Store
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
