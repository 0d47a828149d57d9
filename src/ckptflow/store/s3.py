"""The S3 backend (botocore): AWS and S3-compatible servers (SeaweedFS, Ceph RGW, ...): one bucket on
one endpoint, its client, and the capabilities it offers (``base.StoreCapabilities``).

One file because ``S3Store`` is one class, a method per S3 operation over one client; what the operations
delegate (how files are put, multipart uploads, download shapes, error mapping, retries, small GETs) lives
already in the ``s3_*`` modules beside it.

Checksums are computed only when an operation requires them (botocore >= 1.36 otherwise adds CRC headers
that many S3-compatible servers reject); ckptflow sends its own ``ChecksumSHA256`` on single-part puts,
so the server refuses corrupted bytes on receipt where it verifies checksums. Multipart uploads carry
the whole-file ``sha256`` as user metadata; how files are sent, and whether parts carry their own
checked digests, is ``s3_put.py``. Either way a file that changed after it was hashed aborts the upload
before it is completed. Unfinished multipart uploads (journal, resume, sweep) are the ``s3_uploads``
component the store holds; how downloads are cut is ``s3_shape.py``.

Every botocore failure becomes a ckptflow error that names the object, the endpoint authority and the
error code, never a key or a server-provided message (which may quote request details): ``s3_errors.py``.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import platform
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import botocore
import botocore.loaders
import botocore.session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .. import __version__
from ..digest import FileDigest, is_sha256_hex, sha256_bytes
from ..errors import CkptflowError, NotFound, Refused, StoreError, UsageError, VerificationFailed
from ..progress import ByteProgress
from . import base, s3_put, s3_timestamps, s3_uploads
from .credentials import Credentials, endpoint_authority
from .s3_errors import (
    BAD_DIGEST,
    NO_BUCKET,
    NOT_FOUND,
    STREAM_ERRORS,
    BodyReader,
    ConditionalConflict,
    error_code,
    http_status,
    translate,
)
from .s3_put import b64_sha256
from .s3_retries import announce_retries
from .s3_shape import LOCAL_DOWNLOADS, REMOTE_DOWNLOADS, downloads_for, shape_for
from .s3_small_gets import SmallGets
from .transfer import MIN_PART_SIZE, download_ranges, part_size_for, retry_call
from .uri import destination_label, validate_key, validate_prefix

log = logging.getLogger(__name__)

__all__ = ["LOCAL_DOWNLOADS", "MAX_SINGLE_PART", "REMOTE_DOWNLOADS", "S3Store", "downloads_for", "new_session"]

# A single-part upload is held in memory while it is checked and sent, so it stays small.
MAX_SINGLE_PART = 64 * 1024 * 1024
USER_AGENT = f"ckptflow/{__version__} Botocore/{botocore.__version__} Python/{platform.python_version()}"

_LOADERS: dict[str | None, botocore.loaders.Loader] = {}
_LOADERS_LOCK = threading.Lock()


def new_session() -> botocore.session.Session:
    """A botocore session whose data loader (service models, endpoint rules, partitions) is this process's
    one for its ``AWS_DATA_PATH``: a fresh loader parses the same JSON again, about 0.1 s of CPU for every
    store opened (a trainer publishing in the background, a workflow step, the API in a loop)."""
    session = botocore.session.Session()
    data_path = session.get_config_variable("data_path")
    with _LOADERS_LOCK:
        loader = _LOADERS.get(data_path)
        if loader is None:
            loader = _LOADERS[data_path] = botocore.loaders.create_loader(data_path)
    session.register_component("data_loader", loader)
    return session


def _full_object_sha256(value: str | None, checksum_type: str | None) -> str | None:
    """Hex of a full-object ``ChecksumSHA256``; None for composite (``...-N``) or malformed values."""
    if not value or "-" in value or checksum_type == "COMPOSITE":
        return None
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        return None
    return raw.hex() if len(raw) == 32 else None


def _reported_checksum(value: str | None) -> str | None:
    """A ``ChecksumSHA256`` as reported ("<b64>" or "<b64>-N"); None when absent or malformed."""
    if not value:
        return None
    head, _, count = value.partition("-")
    try:
        ok = len(base64.b64decode(head, validate=True)) == 32 and (not count or count.isdigit())
    except ValueError:
        ok = False
    return value if ok else None


class S3Store:
    """One bucket on one S3 endpoint. Thread-safe: the botocore client is shared by the worker threads.

    Capabilities: ``multipart`` (threshold, resumable uploads through ``unfinished``, the part-checksum
    check), ``download_shape`` (by where the endpoint is, ``s3_shape``), ``concurrency`` and ``small_gets``
    (signed GETs outside botocore's request machinery, with ``get_bytes`` as the fallback: ``s3_small_gets``)."""

    def __init__(
        self,
        bucket: str,
        credentials: Credentials | None,
        *,
        path_style: bool = True,
        multipart_threshold: int = base.DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = base.DEFAULT_PART_SIZE,
        concurrency: int = base.DEFAULT_CONCURRENCY,
        checksum_sha256: bool = True,
        scheme: str = "s3",
        list_page_size: int = 1000,
        download_concurrency: int | None = None,
        download_range_size: int | None = None,
        max_attempts: int = 8,
        part_checksums: bool = True,
        connect_timeout: float = 60.0,
        read_timeout: float = 60.0,
    ):
        if not isinstance(bucket, str) or not bucket or "/" in bucket:
            raise UsageError(f"bucket name {bucket!r} is empty or contains '/'", remedy="pass a bare bucket name")
        if part_size < MIN_PART_SIZE:
            raise UsageError(f"part_size {part_size} is below S3's 5 MiB minimum", remedy="use at least 5 MiB")
        if multipart_threshold > MAX_SINGLE_PART:
            raise UsageError(f"multipart_threshold {multipart_threshold} is above {MAX_SINGLE_PART}: a single-part "
                             "upload is read whole and checked against its digest before it is sent",
                             remedy=f"use at most {MAX_SINGLE_PART} bytes; larger files go in parts")
        download_concurrency, download_range_size = shape_for(
            credentials.endpoint_url if credentials is not None else None, download_concurrency, download_range_size)
        if min(concurrency, list_page_size, download_concurrency, download_range_size, multipart_threshold,
               max_attempts) < 1:
            raise UsageError("concurrency, list_page_size, download_concurrency, download_range_size, "
                             "multipart_threshold and max_attempts must be >= 1")
        if min(connect_timeout, read_timeout) <= 0:
            raise UsageError("connect_timeout and read_timeout must be > 0")
        self.bucket = bucket
        self.scheme = scheme
        self.multipart_threshold = multipart_threshold
        self.part_size = part_size
        self.concurrency = concurrency
        self.list_page_size = list_page_size
        self.download_concurrency = download_concurrency
        self.download_range_size = download_range_size
        self.download_shape = base.DownloadShape(download_concurrency, download_range_size)
        self.supports_checksum_sha256 = checksum_sha256
        self.part_checksums = part_checksums and checksum_sha256
        self._part_check: bool | None = None
        self._part_check_lock = threading.Lock()
        self._unsigned_client = None
        self._unsigned_lock = threading.Lock()
        config = Config(
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            # total_max_attempts counts the first try too (botocore's "max_attempts" would add one more)
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            # botocore's 60 s each by default; a check before work (RequestBounds) asks for a few seconds
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            s3={"addressing_style": "path" if path_style else "auto"},
            max_pool_connections=2 * max(concurrency, download_concurrency) + 2,
            # A fixed User-Agent: botocore otherwise rebuilds and sanitizes its default one twice per
            # request, a tenth of the CPU of a small GET (ls reads one declaration per artifact).
            user_agent=USER_AGENT,
        )
        # A botocore session, not boto3's: boto3 adds nothing a client of ours uses and its import (which
        # loads s3transfer) cost each ckptflow process about 0.1 s.
        session = new_session()
        s3_timestamps.install(session)
        if credentials is not None:
            self._client_args = {
                "endpoint_url": credentials.endpoint_url,
                "region_name": credentials.region_name or "us-east-1",
                "aws_access_key_id": credentials.aws_access_key_id,
                "aws_secret_access_key": credentials.aws_secret_access_key,
            }
            authority = endpoint_authority(credentials)
        else:  # the default AWS chain (environment, ~/.aws, instance role)
            self._client_args = {"region_name": session.get_config_variable("region") or "us-east-1"}
            authority = None
        self._session, self._config, self._max_attempts = session, config, max_attempts
        try:
            self._client = session.create_client("s3", config=config, **self._client_args)
        except BotoCoreError as exc:  # the chain found half a key pair (PartialCredentialsError)
            raise translate(exc, "open", f"{scheme}://{bucket}", bucket) from None
        # botocore's name for where the default chain found keys ("env", "shared-credentials-file",
        # "iam-role" ...; cached by create_client), for the reports; None: explicit keys, or none found.
        found = session.get_credentials() if credentials is None else None
        self.credentials_method: str | None = getattr(found, "method", None)
        if authority is None:
            authority = self._client.meta.endpoint_url.split("://", 1)[-1].split("/", 1)[0]
        self.destination = base.Destination(scheme, authority, bucket)
        announce_retries(self._client, destination_label(self.destination), max_attempts)
        self.unfinished = s3_uploads.UnfinishedUploads(self._client, self.destination,
                                                       threshold=multipart_threshold, part_size=part_size)
        self.multipart = base.MultipartUploads(multipart_threshold, resumable=self.unfinished,
                                               part_checksums_enforced=self.part_checksums_enforced)
        self.small_gets = SmallGets(self._client, bucket, user_agent=USER_AGENT, pool_size=2 * concurrency + 2,
                                    fallback=self.get_bytes)

    def __repr__(self) -> str:
        return f"S3Store({destination_label(self.destination)})"

    # ------------------------------------------------------------------ errors

    def _where(self, key: str) -> str:
        return s3_uploads.object_label(self.destination, key)

    def _error(self, exc: Exception, op: str, key: str) -> CkptflowError:
        return translate(exc, op, self._where(key), self.bucket)

    def _call(self, op: str, key: str, fn, **kwargs):
        try:
            return fn(**kwargs)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, op, key) from None

    # ------------------------------------------------------------------ protocol

    def require_bucket(self) -> None:
        """HeadBucket: refuse a bucket that does not exist before anything is written, also on servers
        (SeaweedFS) that would create it at the first PUT."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if error_code(exc) in NOT_FOUND | NO_BUCKET:
                raise NotFound(f"bucket {self.bucket!r} does not exist at {self.destination.endpoint} "
                               "(HeadBucket: 404); nothing was written",
                               remedy="create the bucket first, or pass the right --bucket") from None
            if error_code(exc) in ("403", "AccessDenied"):
                # Only an existing bucket answers 403 to a caller allowed to write under a prefix but not
                # to list the bucket (a common IAM shape); bad credentials fail at the first request that
                # needs them, as they did before this check.
                log.info("bucket %r at %s: HeadBucket is not allowed (403); taken as existing",
                         self.bucket, self.destination.endpoint)
                return
            raise self._error(exc, "HeadBucket", "") from None
        except BotoCoreError as exc:
            raise self._error(exc, "HeadBucket", "") from None

    def head(self, key: str) -> base.ObjectInfo | None:
        validate_key(key)
        kwargs = {"Bucket": self.bucket, "Key": key}
        if self.supports_checksum_sha256:
            kwargs["ChecksumMode"] = "ENABLED"
        try:
            resp = self._client.head_object(**kwargs)
        except ClientError as exc:
            if error_code(exc) in NOT_FOUND:
                return None
            raise self._error(exc, "HEAD", key) from None
        except BotoCoreError as exc:
            raise self._error(exc, "HEAD", key) from None
        return base.ObjectInfo(
            key=key,
            size=int(resp["ContentLength"]),
            sha256=(resp.get("Metadata") or {}).get("sha256"),
            etag=(resp.get("ETag") or "").strip('"') or None,
            checksum_sha256=_full_object_sha256(resp.get("ChecksumSHA256"), resp.get("ChecksumType")),
            checksum=_reported_checksum(resp.get("ChecksumSHA256")),
        )

    def put_bytes_create_once(self, key: str, data: bytes, *, sha256: str) -> bool:
        """``PutObject`` with ``If-None-Match: *``. False when the key exists (412).

        False can also follow a retry of our own request whose first attempt was stored but whose
        answer was lost; callers compare the existing object with what they meant to write.
        """
        validate_key(key)
        if not is_sha256_hex(sha256) or sha256_bytes(data) != sha256:
            raise UsageError(f"sha256 given for {self._where(key)} does not match the bytes to write")
        kwargs = {"Bucket": self.bucket, "Key": key, "Body": data, "IfNoneMatch": "*",
                  "Metadata": {"sha256": sha256}, "ContentLength": len(data)}
        if self.supports_checksum_sha256:
            kwargs["ChecksumSHA256"] = b64_sha256(sha256)

        def once() -> bool:
            try:
                self._client.put_object(**kwargs)
                return True
            except ClientError as exc:
                if error_code(exc) == "PreconditionFailed" or http_status(exc) == 412:
                    return False
                if error_code(exc) == "ConditionalRequestConflict":
                    raise ConditionalConflict(
                        f"create-once PUT {self._where(key)} kept conflicting with a concurrent write "
                        "(409 ConditionalRequestConflict)", remedy="retry later") from None
                raise self._error(exc, "PUT (create-once)", key) from None
            except BotoCoreError as exc:
                raise self._error(exc, "PUT (create-once)", key) from None

        return retry_call(once, retry_on=(ConditionalConflict,), attempts=6)

    # CopyObject copies at most 5 GiB in one request; a larger object adopted by its bytes is sent again.
    adopts_objects_up_to = 5 * 1024**3

    def adopt_object(self, key: str, digest: FileDigest, *, etag: str | None) -> base.ObjectInfo | None:
        """CopyObject of ``key`` onto itself with ``sha256`` metadata (the server copies the bytes; none is
        sent), made only from the object whose ETag is ``etag`` (``x-amz-copy-source-if-match``): an object
        replaced since it was read is not given the digest of bytes it may not hold (None: send the file).
        The copy asks for a SHA-256 server checksum; an endpoint that computes none on a copy (SeaweedFS)
        leaves that object provable by its bytes only (``verify --read-data``, ``prune-verified --read-data``).
        An endpoint that refuses the copy itself gets the file sent (None)."""
        validate_key(key)
        if etag is None or digest.size > self.adopts_objects_up_to:
            return None
        kwargs = {"Bucket": self.bucket, "Key": key, "CopySource": {"Bucket": self.bucket, "Key": key},
                  "CopySourceIfMatch": f'"{etag}"', "MetadataDirective": "REPLACE", "Metadata": {"sha256": digest.sha256}}
        if self.supports_checksum_sha256:  # the copy's server checksum, the HEAD proof a receipt records
            kwargs["ChecksumAlgorithm"] = "SHA256"
        try:
            self._client.copy_object(**kwargs)
        except ClientError as exc:
            if error_code(exc) != "PreconditionFailed" and http_status(exc) != 412:
                # An endpoint or policy without CopyObject: sending the file is the way that always works.
                log.info("%s: CopyObject refused (%s); the file is sent instead", self._where(key), error_code(exc))
            return None
        except BotoCoreError as exc:
            raise self._error(exc, "CopyObject (adopt)", key) from None
        info = self.head(key)
        return info if info is not None and (info.size, info.sha256) == (digest.size, digest.sha256) else None

    def put_file(
        self, key: str, path: Path, *, digest: FileDigest, progress: ByteProgress | None = None
    ) -> base.ObjectInfo:
        [info] = self.put_files([(key, Path(path), digest)], progress=progress)
        return info

    def put_files(self, files: Sequence[tuple[str, Path, FileDigest]], *, progress: ByteProgress | None = None,
                  on_stored: Callable[[str], None] | None = None,
                  uploads: base.UploadLog | None = None) -> list[base.ObjectInfo]:
        """``put_file`` for several files: the multipart ones as one stream of parts (no idle
        connections between files), each completed and HEAD-checked on a commit thread while later
        ones are sent; the others one by one. ``on_stored(key)`` follows each verified file.

        With ``uploads``, multipart uploads are journaled and an unfinished one a killed run left for
        the same bytes is resumed: only its parts not proven to hold them are sent (``s3_uploads``);
        one left for other bytes is aborted. ``uploads`` records both and the bytes sent."""
        return s3_put.put_files(self, files, progress=progress, on_stored=on_stored, uploads=uploads)

    # ------------------------------------------------------------------ unfinished uploads (s3_uploads)
    # The component's operations for direct users of an S3 store; the archive reaches the resumable ones
    # through ``multipart.resumable``, which every backend has (or lacks) alike.

    def resumable_part_size(self, key: str, size: int) -> int | None:
        return self.unfinished.resumable_part_size(key, size)

    def list_uploads(self, prefix: str) -> list[s3_uploads.PendingUpload]:
        return self.unfinished.list_uploads(prefix)

    def upload_is_live(self, key: str, upload_id: str) -> bool | None:
        return self.unfinished.upload_is_live(key, upload_id)

    def sweep_uploads(self, prefix: str, *, older_than: float, journaled_any_age: bool = False,
                      dry_run: bool = False) -> tuple[list[dict], list[dict]]:
        return self.unfinished.sweep_uploads(prefix, older_than=older_than, journaled_any_age=journaled_any_age,
                                             dry_run=dry_run)

    # ------------------------------------------------------------------ verified part checksums

    def part_digest_size(self, size: int) -> int | None:
        """The part size whose per-part digests ``put_files`` can use for a file of ``size`` bytes (pass
        it to ``sha256_file(part_size=...)``); None when it would not use them."""
        if not self.part_checksums or size <= 0 or size < self.multipart_threshold:
            return None
        return part_size_for(size, self.part_size)

    def part_checksums_enforced(self, key: str) -> bool:
        """Whether the endpoint refuses an upload part whose bytes do not match its ``ChecksumSHA256``
        and accepts one that does. Tried once per store, on a multipart upload at ``key`` that is always
        aborted (nothing becomes visible); any doubt (an error, another refusal code) answers False, and
        uploads then hash what they send themselves."""
        with self._part_check_lock:
            if self._part_check is None:
                self._part_check = s3_put.check_part_checksums(self._unsigned(), self.bucket, key)
                log.info("%s %s part checksums: %s", self.destination.endpoint, self.bucket,
                         "enforced, each part is checked by the server" if self._part_check
                         else "not enforced, parts are hashed here as they are sent")
            return self._part_check

    def _unsigned(self):
        """A client that signs part requests without hashing their bodies (``UNSIGNED-PAYLOAD``). Used
        only with a ``x-amz-checksum-sha256`` header, which is signed and which the endpoint verifies,
        so the body is bound as strongly as a signed payload would bind it, with one hash fewer."""
        with self._unsigned_lock:
            if self._unsigned_client is None:
                s3 = dict(self._config.s3 or {}, payload_signing_enabled=False)
                self._unsigned_client = self._session.create_client(
                    "s3", config=self._config.merge(Config(s3=s3)), **self._client_args)
                announce_retries(self._unsigned_client, destination_label(self.destination), self._max_attempts)
            return self._unsigned_client

    def put_bytes_wrong_checksum(self, key: str, data: bytes) -> bool:
        """Endpoint probe: PUT ``data`` declaring the ``ChecksumSHA256`` of other bytes.

        True when the endpoint stored it anyway (it does not verify checksums); False when it refused
        (400 BadDigest / InvalidRequest). Used only by ``ckptflow probe`` on a scratch key.
        """
        validate_key(key)
        wrong = sha256_bytes(data + b"\x00")
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentLength=len(data),
                                    ChecksumSHA256=b64_sha256(wrong))
        except ClientError as exc:
            if http_status(exc) in (400, 422) or error_code(exc) in BAD_DIGEST:
                return False
            raise self._error(exc, "PUT (wrong checksum probe)", key) from None
        except BotoCoreError as exc:
            raise self._error(exc, "PUT (wrong checksum probe)", key) from None
        return True

    @contextlib.contextmanager
    def open_range(self, key: str, offset: int, length: int):
        """A reader of bytes ``[offset, offset + length)`` of ``key`` (see ``ObjectStore.open_range``)."""
        validate_key(key)
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={offset}-{offset + length - 1}")
        except ClientError as exc:
            if error_code(exc) == "InvalidRange":
                raise VerificationFailed(f"{self._where(key)} has no bytes at offset {offset}",
                                         remedy="the object is shorter than its recorded size") from None
            raise self._error(exc, "GET", key) from None
        except BotoCoreError as exc:
            raise self._error(exc, "GET", key) from None
        body = resp["Body"]
        try:
            sent = resp.get("ContentLength")
            if sent is not None and sent != length:
                raise VerificationFailed(
                    f"{self._where(key)} answered {sent} bytes for the range at {offset}, expected {length}",
                    remedy="the object's size differs from the archive's record; check it")
            reader = BodyReader(body, self._where(key))
            yield reader
            reader.finish()
        finally:
            body.close()

    def download_file(self, key: str, dest: Path, *, size: int | None = None, start: int = 0, hasher=None,
                      progress: ByteProgress | None = None) -> FileDigest:
        validate_key(key)
        if size is None:
            info = self.head(key)
            if info is None:
                raise NotFound(f"{self._where(key)} does not exist", remedy="check the bucket and prefix")
            size = info.size
        return download_ranges(
            Path(dest), size=size, start=start, hasher=hasher, progress=progress,
            concurrency=self.download_concurrency, range_size=self.download_range_size, source=self._where(key),
            open_range=lambda offset, length: self.open_range(key, offset, length),
        )

    def get_bytes(self, key: str, *, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        validate_key(key)
        resp = self._call("GET", key, self._client.get_object, Bucket=self.bucket, Key=key)
        body = resp["Body"]
        try:
            length = int(resp.get("ContentLength") or 0)
            data = b"" if length > max_bytes else body.read(max_bytes + 1)
        except STREAM_ERRORS as exc:
            raise StoreError(f"GET {self._where(key)}: body broke off ({type(exc).__name__})",
                             remedy="retry") from None
        finally:
            body.close()
        if length > max_bytes or len(data) > max_bytes:
            raise Refused(f"{self._where(key)} is larger than the {max_bytes} bytes allowed for a record",
                          remedy="this key does not hold a record; check the prefix")
        return data

    def list(self, prefix: str) -> list[base.ObjectInfo]:
        return sorted(self.iter_list(prefix), key=lambda info: info.key)

    def iter_list(self, prefix: str) -> Iterator[base.ObjectInfo]:
        validate_prefix(prefix)
        pages = self._client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix, PaginationConfig={"PageSize": self.list_page_size})
        try:
            for page in pages:
                for obj in page.get("Contents", []):
                    etag = (obj.get("ETag") or "").strip('"') or None
                    when = obj.get("LastModified")
                    yield base.ObjectInfo(key=obj["Key"], size=int(obj["Size"]), etag=etag,
                                          modified=when.timestamp() if when is not None else None)
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "LIST", prefix) from None

    def delete(self, key: str) -> None:
        validate_key(key)
        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if error_code(exc) not in NOT_FOUND:
                raise self._error(exc, "DELETE", key) from None
        except BotoCoreError as exc:
            raise self._error(exc, "DELETE", key) from None
