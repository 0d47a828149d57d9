"""How the S3 backend reads botocore's failures: error codes, the ckptflow error each becomes, and
response bodies that break off.

A translated error names the object, the endpoint authority and the error code, never a key or a
server-provided message (which may quote request details).
"""

from __future__ import annotations

from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    HTTPClientError,
    IncompleteReadError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

from ..errors import CkptflowError, NotFound, StoreError, VerificationFailed
from .credentials import ENV_VAR
from .transfer import TransientRead

NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})
NO_BUCKET = frozenset({"NoSuchBucket"})
BAD_DIGEST = frozenset({"BadDigest", "XAmzContentSHA256Mismatch", "InvalidDigest"})
AUTH = frozenset({"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "ExpiredToken",
                  "InvalidToken", "AuthorizationHeaderMalformed"})
STREAM_ERRORS = (ResponseStreamingError, IncompleteReadError, ReadTimeoutError, ConnectionClosedError)


class ConditionalConflict(StoreError):
    """409 ConditionalRequestConflict: a concurrent conditional write is in progress; retried."""


class BodyReader:
    """``readinto`` on a GetObject body (read straight into the caller's buffer); a body that breaks off
    (connection reset, timeout, fewer bytes than its Content-Length) raises ``TransientRead``."""

    def __init__(self, body, where: str):
        self._body, self._where = body, where

    def readinto(self, view: memoryview) -> int:
        try:
            return self._body.readinto(view)
        except STREAM_ERRORS as exc:
            raise TransientRead(f"GET {self._where}: body broke off ({type(exc).__name__})",
                                remedy="retry") from None


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", "")) or str(
        exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
    )


def http_status(exc: ClientError) -> object:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")


def translate(exc: Exception, op: str, where: str, bucket: str) -> CkptflowError:
    """The ckptflow error for a botocore failure of ``op`` on ``where`` (object and endpoint) in ``bucket``."""
    if isinstance(exc, ClientError):
        code, status = error_code(exc), http_status(exc)
        if code in NOT_FOUND:
            return NotFound(f"{op} {where}: no such object", remedy="check the bucket and prefix")
        if code in NO_BUCKET:
            return StoreError(f"{op} {where}: bucket {bucket!r} does not exist (NoSuchBucket)",
                              remedy="create the bucket or pass the right --bucket")
        if code in BAD_DIGEST:
            return VerificationFailed(
                f"{op} {where}: the server rejected the bytes as not matching their checksum ({code})",
                remedy="the file changed after it was hashed or was corrupted in transit; hash it again")
        if code in AUTH:
            remedy = f"check the keys in the credentials file (--credentials or ${ENV_VAR}) for this endpoint"
        else:
            remedy = "retry; if it persists, check the endpoint's logs"
        err = StoreError(f"{op} {where} failed: {code} (HTTP {status})", remedy=remedy)
        err.code = code
        return err
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return StoreError(f"{op} {where}: no credentials found",
                          remedy=f"pass --credentials FILE or set ${ENV_VAR}")
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return StoreError(f"{op} {where}: cannot reach the endpoint ({type(exc).__name__})",
                          remedy="check endpoint_url in the credentials file and that the server is up")
    return StoreError(f"{op} {where} failed: {type(exc).__name__}",
                      remedy="retry; if it persists, check the endpoint and the credentials file")
