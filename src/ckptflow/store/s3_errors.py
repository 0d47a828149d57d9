"""How the S3 backend reads botocore's failures: error codes, the ckptflow error each becomes, and
response bodies that break off.

A translated error names the object, the endpoint authority and the error code, never a key or a
server-provided message (which may quote request details).
"""

from __future__ import annotations

import http.client

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

from ..errors import CkptflowError, EndpointUnreachable, NotFound, StoreError, VerificationFailed
from .credentials import ENV_VAR, SOURCES_IN_ORDER
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
    (connection reset, timeout, fewer bytes than its Content-Length) raises ``TransientRead``.

    Where the body is a plain (not content-encoded) HTTP response that nothing has read yet, it is read
    from the socket's own ``http.client`` response: urllib3's ``readinto`` reads into a new bytes object
    and copies that into the buffer, an extra copy of every byte (and an allocation per piece) that this
    skips. Once the body is read to its end, ``finish`` gives the connection back to the pool, as
    urllib3 does after a read to the end; otherwise (and on any failure) the connection is closed with
    the body.
    """

    def __init__(self, body, where: str):
        self._body, self._where = body, where
        self._plain = _plain_response(body)

    def readinto(self, view: memoryview) -> int:
        try:
            if self._plain is None:
                return self._body.readinto(view)
            n = self._plain.readinto(view)
            if not n and len(view) and self._plain.length:  # the connection ended before Content-Length
                raise http.client.IncompleteRead(b"", self._plain.length)
            return n
        except STREAM_ERRORS as exc:
            raise TransientRead(f"GET {self._where}: body broke off ({type(exc).__name__})",
                                remedy="retry") from None
        except (http.client.HTTPException, OSError) as exc:
            if self._plain is None:
                raise
            raise TransientRead(f"GET {self._where}: body broke off ({type(exc).__name__})",
                                remedy="retry") from None

    def finish(self) -> None:
        """After a read to the end: the connection goes back to the pool (see the class docstring)."""
        if self._plain is not None and self._plain.isclosed():
            self._body._raw_stream.release_conn()


def _plain_response(body) -> http.client.HTTPResponse | None:
    """The ``http.client`` response under botocore's body, when reading it directly is equivalent."""
    stream = getattr(body, "_raw_stream", None)
    response = getattr(stream, "_fp", None)
    if not isinstance(response, http.client.HTTPResponse) or not hasattr(stream, "release_conn"):
        return None
    headers = getattr(stream, "headers", None) or {}
    if headers.get("content-encoding") or getattr(stream, "_fp_bytes_read", None) != 0:
        return None
    return response


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
    if isinstance(exc, PartialCredentialsError):  # botocore's message names the provider and the missing variable
        return StoreError(f"{op} {where}: incomplete credentials in botocore's chain ({exc})",
                          remedy=f"set both keys of the pair, or pass --credentials FILE or set ${ENV_VAR}")
    if isinstance(exc, NoCredentialsError):
        tried = ", ".join(f"{source} ({outcome})" for source, outcome in
                          zip(SOURCES_IN_ORDER, ("none given", "not set", "no keys found"), strict=True))
        return StoreError(f"{op} {where}: no credentials found; tried, in order: {tried}",
                          remedy=f"pass --credentials FILE, set ${ENV_VAR} to a credentials file, or set "
                          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)")
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return EndpointUnreachable(
            f"{op} {where}: cannot reach the endpoint ({type(exc).__name__})",
            remedy="check endpoint_url in the credentials file and that the server is up")
    return StoreError(f"{op} {where} failed: {type(exc).__name__}",
                      remedy="retry; if it persists, check the endpoint and the credentials file")
