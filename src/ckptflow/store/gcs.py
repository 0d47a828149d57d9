"""Google Cloud Storage backend: S3 interoperability for bulk traffic, a GOOG4-signed XML PUT for create-once.

Reads, HEAD, listings, deletes and file uploads go through Cloud Storage's S3-interoperability XML API
with botocore (an :class:`~ckptflow.store.s3.S3Store` with ``scheme="gs"``, built on first use), against
``https://storage.googleapis.com`` unless the credentials name another endpoint, with an HMAC key as
``aws_access_key_id`` / ``aws_secret_access_key`` and region ``auto``. The interop API does not verify
``x-amz-checksum-sha256``, so ``supports_checksum_sha256`` is False and none is sent; integrity rests
on the ``sha256`` metadata checked by HEAD and on the full-content hash when fetching.

The exception is :meth:`GCSStore.put_bytes_create_once` (declarations and manifests, invariant 3). S3's
``If-None-Match: *`` has no meaning on the interop API; the create-once precondition of Cloud Storage is
``x-goog-if-generation-match: 0``. Real GCS refuses a request that mixes ``x-amz-*`` and ``x-goog-*``
headers, so this is a separate plain HTTP ``PUT <endpoint>/<bucket>/<key>`` sent with ``requests`` and
signed with GOOG4-HMAC-SHA256 (:mod:`ckptflow.store.gcs_sign`), carrying only ``x-goog-*`` headers:
``x-goog-if-generation-match: 0``, ``x-goog-meta-sha256``, ``x-goog-content-sha256`` (the server checks
the body against it), ``x-goog-date``. ``x-goog-meta-sha256`` is the same custom-metadata key
(``sha256``) that the interop HEAD reports as ``x-amz-meta-sha256``, so objects written here read back
with their ``sha256`` like every other object.

**Qualification.** Whether an endpoint really enforces ``x-goog-if-generation-match`` is not something
this module can promise: it must be qualified with ``ckptflow probe`` on the real endpoint (second
create refused, one winner among concurrent creators). The local fake-gcs-server *ignores* the
precondition on XML PUT, so the GCS create-once path cannot be qualified offline; the tests here only
check the request shape against a recording server. Publication with ``--delete-local`` (and
``prune-verified``) requires a passing probe record for the endpoint + bucket, so an endpoint that
accepts overwrites fails closed instead of losing data.

Secrets: the HMAC secret is used only to derive the signing key. It never appears in a log line, an
exception message, a repr or a record; neither does the ``Authorization`` header.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import re
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import requests

from ..digest import FileDigest, is_sha256_hex, sha256_bytes
from ..errors import StoreError, UsageError
from ..progress import ByteProgress
from . import gcs_sign
from .base import DEFAULT_CONCURRENCY, DEFAULT_MULTIPART_THRESHOLD, Destination, MultipartUploads, ObjectInfo
from .credentials import Credentials, endpoint_authority
from .s3_shape import shape_for
from .uri import validate_key

if TYPE_CHECKING:
    from .s3 import S3Store

log = logging.getLogger(__name__)

DEFAULT_GCS_ENDPOINT = "https://storage.googleapis.com"
DEFAULT_GCS_REGION = "auto"
DEFAULT_MAX_ATTEMPTS = 5
DEFAULT_BACKOFF_BASE_S = 0.5
DEFAULT_BACKOFF_CAP_S = 8.0
DEFAULT_TIMEOUT_S: tuple[float, float] = (10.0, 120.0)
CREATE_ONCE_CONTENT_TYPE = "application/octet-stream"

_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_GOOG_META = "x-goog-meta-"
_ERROR_CODE_RE = re.compile(rb"<Code>\s*([A-Za-z0-9_.\-]{1,64})\s*</Code>")


def _now_utc() -> datetime:
    return datetime.now(timezone.utc)


def _goog_metadata_as_amz(parsed: Any = None, **_: Any) -> None:
    """botocore ``after-call`` hook: expose ``x-goog-meta-*`` response headers as ``Metadata``.

    Custom metadata on Cloud Storage has one name whichever header family set it (``x-goog-meta-sha256``
    from :meth:`GCSStore.put_bytes_create_once`, ``x-amz-meta-sha256`` from interop uploads); the
    interop API normally reports it as ``x-amz-meta-*``, which boto3 parses into ``Metadata``. Should
    the endpoint answer with ``x-goog-meta-*`` instead, this copies those headers in, so HEAD sees
    ``sha256`` either way. An ``x-amz-meta-*`` value already parsed wins.
    """
    if not isinstance(parsed, dict):
        return
    raw = (parsed.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    found = {
        name[len(_GOOG_META) :].lower(): value
        for name, value in raw.items()
        if isinstance(name, str) and name.lower().startswith(_GOOG_META)
    }
    if found:
        metadata = parsed.setdefault("Metadata", {})
        for name, value in found.items():
            metadata.setdefault(name, value)


class GCSStore:
    """:class:`~ckptflow.store.base.ObjectStore` on Google Cloud Storage with an HMAC key.

    ``credentials`` carries ``aws_access_key_id`` (the HMAC access id), ``aws_secret_access_key``
    (the HMAC secret) and ``endpoint_url`` (None: ``https://storage.googleapis.com``). Its
    ``region_name`` is not used: the GOOG4 scope and the interop client use ``region`` ("auto").
    Remaining keyword arguments (``multipart_threshold``, ``part_size``, ``concurrency``,
    ``path_style``, ...) go to the underlying :class:`~ckptflow.store.s3.S3Store`, which is built on
    first use (create-once alone never needs botocore). ``clock`` and ``sleep`` are injectable for tests.

    Composition, not inheritance: create-once is this class's own (GOOG4 XML PUT); every other method
    of the protocol is forwarded explicitly below. Nothing else is: S3-only operations (the probe's
    wrong-checksum PUT, part-checksum checks) do not exist on a GCS store. Its capabilities are said
    without building the S3-interop client: multipart uploads from the same threshold, but none kept
    to resume or sweep and no part checksums (the interop API verifies none).
    """

    supports_checksum_sha256 = False
    adopts_objects_up_to = 0  # no copy onto itself is qualified here: an object adopted by its bytes is sent

    def __init__(
        self,
        bucket: str,
        credentials: Credentials,
        *,
        region: str = DEFAULT_GCS_REGION,
        clock: Callable[[], datetime] | None = None,
        sleep: Callable[[float], None] | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff_base_s: float = DEFAULT_BACKOFF_BASE_S,
        backoff_cap_s: float = DEFAULT_BACKOFF_CAP_S,
        timeout: float | tuple[float, float] = DEFAULT_TIMEOUT_S,
        **s3_kwargs: Any,
    ):
        if not isinstance(bucket, str) or not bucket or "/" in bucket:
            raise UsageError(
                f"bucket name {bucket!r} is empty or contains '/'", remedy="pass a bare bucket name"
            )
        if max_attempts < 1:
            raise UsageError("max_attempts must be at least 1", remedy="pass max_attempts >= 1")
        if not isinstance(credentials, Credentials):
            raise UsageError(
                f"gs://{bucket}: Cloud Storage needs an HMAC key in a credentials file",
                remedy="pass --credentials FILE (aws_access_key_id/aws_secret_access_key = the HMAC key)",
            )
        self.bucket = bucket
        self.region = region
        endpoint = (credentials.endpoint_url or DEFAULT_GCS_ENDPOINT).rstrip("/")
        # Validated by Credentials (http(s), host, no userinfo/query/fragment).
        self._credentials = dataclasses.replace(credentials, endpoint_url=endpoint, region_name=region)
        self.endpoint_url = endpoint
        parts = urlsplit(endpoint)
        self._host = endpoint_authority(self._credentials)
        self._base_path = parts.path.rstrip("/")
        self._wire_prefix = f"{parts.scheme}://{self._host}"
        self.destination = Destination(scheme="gs", endpoint=self._host, bucket=bucket)
        self._clock = clock or _now_utc
        self._sleep = sleep or time.sleep
        self._max_attempts = max_attempts
        self._backoff_base_s = backoff_base_s
        self._backoff_cap_s = backoff_cap_s
        self._timeout = timeout
        self._s3_kwargs = s3_kwargs
        self.multipart = MultipartUploads(s3_kwargs.get("multipart_threshold", DEFAULT_MULTIPART_THRESHOLD))
        self.download_shape = shape_for(endpoint, s3_kwargs.get("download_concurrency"),
                                        s3_kwargs.get("download_range_size"))
        self.concurrency: int = s3_kwargs.get("concurrency", DEFAULT_CONCURRENCY)
        self.small_gets = None  # records are read through the interop client's own get_bytes
        self._s3_obj: S3Store | None = None
        self._s3_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"GCSStore(gs://{self.bucket} at {self._host})"

    # ------------------------------------------------------------------ S3-interop part (lazy)

    @property
    def _s3(self) -> S3Store:
        if self._s3_obj is None:
            with self._s3_lock:
                if self._s3_obj is None:
                    from .s3 import S3Store  # built on first use: create-once does not need botocore

                    s3 = S3Store(
                        self.bucket,
                        self._credentials,
                        **{**self._s3_kwargs, "scheme": "gs", "checksum_sha256": False},
                    )
                    for op in ("HeadObject", "GetObject"):
                        s3._client.meta.events.register(f"after-call.s3.{op}", _goog_metadata_as_amz)
                    self._s3_obj = s3
        return self._s3_obj

    def require_bucket(self) -> None:
        self._s3.require_bucket()

    def head(self, key: str) -> ObjectInfo | None:
        return self._s3.head(key)

    def put_file(
        self, key: str, path: Path, *, digest: FileDigest, progress: ByteProgress | None = None
    ) -> ObjectInfo:
        return self._s3.put_file(key, path, digest=digest, progress=progress)

    def part_digest_size(self, size: int) -> int | None:
        return self._s3.part_digest_size(size)  # None: GCS interop takes no x-amz-checksum-* headers

    def adopt_object(self, key: str, digest: FileDigest, *, etag: str | None) -> ObjectInfo | None:
        return None  # adopts_objects_up_to is 0

    def put_files(self, files, *, progress: ByteProgress | None = None, on_stored=None) -> list[ObjectInfo]:
        return self._s3.put_files(files, progress=progress, on_stored=on_stored)

    def get_bytes(self, key: str, *, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        return self._s3.get_bytes(key, max_bytes=max_bytes)

    def download_file(
        self,
        key: str,
        dest: Path,
        *,
        size: int | None = None,
        start: int = 0,
        hasher=None,
        progress: ByteProgress | None = None,
    ) -> FileDigest:
        return self._s3.download_file(key, dest, size=size, start=start, hasher=hasher, progress=progress)

    def open_range(self, key: str, offset: int, length: int):
        return self._s3.open_range(key, offset, length)

    def list(self, prefix: str) -> list[ObjectInfo]:
        return self._s3.list(prefix)

    def iter_list(self, prefix: str):
        return self._s3.iter_list(prefix)

    def delete(self, key: str) -> None:
        self._s3.delete(key)

    # ------------------------------------------------------------------ create-once (GOOG4 XML PUT)

    def _url_and_signed(self, key: str, data: bytes, sha256: str) -> tuple[str, gcs_sign.SignedRequest]:
        signed = gcs_sign.sign_request(
            "PUT",
            self._host,
            f"{self._base_path}/{self.bucket}/{key}",
            headers={
                "Content-Type": CREATE_ONCE_CONTENT_TYPE,
                "Content-Length": str(len(data)),
                "x-goog-if-generation-match": "0",
                "x-goog-meta-sha256": sha256,
            },
            payload_sha256=sha256,
            access_key_id=self._credentials.aws_access_key_id,
            secret_access_key=self._credentials.aws_secret_access_key,
            region=self.region,
            now=self._clock(),
            scheme=gcs_sign.GOOG4,
        )
        return self._wire_prefix + signed.encoded_path, signed

    def _send(self, key: str, data: bytes, sha256: str) -> requests.Response:
        url, signed = self._url_and_signed(key, data, sha256)
        with requests.Session() as session:
            prepared = session.prepare_request(
                requests.Request("PUT", url, headers=signed.headers, data=data)
            )
            # Send the path exactly as signed: no re-quoting by the HTTP client.
            prepared.url = url
            # Proxies and CA bundle from the environment, as session.request() would apply them.
            settings = session.merge_environment_settings(url, {}, None, None, None)
            response = session.send(prepared, timeout=self._timeout, allow_redirects=False, **settings)
            response.content  # read the (small) body so the connection can be released  # noqa: B018
            return response

    def _backoff(self, attempt: int, retry_after: str | None) -> float:
        delay = min(self._backoff_cap_s, self._backoff_base_s * 2 ** (attempt - 1))
        delay *= 0.5 + random.random() / 2
        if retry_after:
            try:
                delay = max(delay, min(self._backoff_cap_s, float(retry_after)))
            except ValueError:
                pass
        return delay

    def put_bytes_create_once(self, key: str, data: bytes, *, sha256: str) -> bool:
        """Create ``gs://bucket/key`` only if no live object exists there (generation-match 0).

        True: this call created it. False: the server answered 412, an object exists. A retry after a
        lost response (timeout, 5xx) can also see 412 for an object this very call created, so callers
        treat False as "something is there" and compare its digest, as for any existing object.
        """
        validate_key(key)
        where = f"gs://{self.bucket}/{key}"
        if not is_sha256_hex(sha256) or sha256_bytes(data) != sha256:
            raise UsageError(
                f"sha256 given for {where} at {self._host} does not match the bytes to write",
                remedy="hash the exact bytes being written and pass that lowercase hex digest",
            )
        for attempt in range(1, self._max_attempts + 1):
            try:
                response = self._send(key, data, sha256)
            except requests.RequestException as exc:
                problem = f"{type(exc).__name__}"
                log.debug("create-once PUT %s attempt %d: %s", where, attempt, problem)
                if attempt == self._max_attempts:
                    raise StoreError(
                        f"create-once PUT {where} at {self._host} failed after {attempt} attempts: {problem}",
                        remedy="check endpoint_url in the credentials file and that the endpoint is up",
                    ) from None
                self._sleep(self._backoff(attempt, None))
                continue
            status = response.status_code
            log.debug("create-once PUT %s attempt %d: HTTP %d", where, attempt, status)
            if 200 <= status < 300:
                return True
            if status == 412:
                return False
            if status in _RETRY_STATUSES and attempt < self._max_attempts:
                self._sleep(self._backoff(attempt, response.headers.get("Retry-After")))
                continue
            match = _ERROR_CODE_RE.search(response.content or b"")
            code = f" ({match.group(1).decode('ascii')})" if match else ""
            if status in (401, 403):
                remedy = (
                    "check the HMAC key (access id and secret), its write permission on the bucket, "
                    "and this machine's clock"
                )
            elif status == 400:
                remedy = "the endpoint refused the request shape; check endpoint_url points at a GCS XML API"
            elif status == 404:
                remedy = "check that the bucket exists on this endpoint"
            else:
                remedy = "rerun the same command; if it persists, check the endpoint's status"
            tries = f" after {attempt} attempts" if attempt > 1 else ""
            raise StoreError(
                f"create-once PUT {where} at {self._host}: HTTP {status}{code}{tries}", remedy=remedy
            )
        raise AssertionError("unreachable")  # pragma: no cover
