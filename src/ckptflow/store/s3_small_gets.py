"""Many small whole-object GETs (records: one declaration per artifact in ``ls``) on an S3 store, without
botocore's per-request machinery: ``SmallGets``, the store's ``small_gets`` capability.

A GET through a botocore client costs about 0.7 ms of CPU (event hooks, endpoint rules, parameter
validation, response parsing) where the request itself is a few headers. The fast path here signs each
GET with SigV4 exactly as botocore's ``S3SigV4Auth`` would (``_GetSigner``: the same canonical request for a
GET with no query and no body, the signing key derived once per secret and day instead of per request;
a test compares its Authorization header with botocore's), with the client's current credentials (which
may refresh) and its region and signing name, at the URL the client itself gives for the object (the
bucket's URL is taken once from a presigned URL of the client, so path-style or virtual-host addressing
and endpoint rules are the client's; keys are quoted as botocore quotes them), and sends it on a kept-alive
``http.client`` connection that verifies TLS as the client does (its CA bundle, or no verification when
the client has none).

Only a ``200`` whose body has exactly its ``Content-Length`` of at most ``max_bytes`` bytes is taken from
the fast path. Anything else (404, 403, 5xx, a redirect, a connection error, a body that breaks off or is
too large, a header we do not expect) sends that key again through the store's normal ``get_bytes``,
which has the retries, the error mapping and the retry announcement. So the fast path can only make a
read faster, never change its outcome. A client the fast path cannot reproduce exactly (a proxy, a client
certificate, no credentials) never uses it.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import logging
import os
import select
import ssl
import threading
import weakref
from collections.abc import Callable
from urllib.parse import quote, urlsplit

from botocore.auth import EMPTY_SHA256_HASH, SIGV4_TIMESTAMP, _host_from_url
from botocore.exceptions import BotoCoreError
from botocore.httpsession import get_cert_path
from botocore.utils import get_current_datetime

log = logging.getLogger(__name__)

# Headers whose presence means the body may not be the object's bytes as botocore would return them.
_UNEXPECTED = ("content-encoding", "content-range", "transfer-encoding")
_PROBE_KEY = "ckptflow-url-probe"
_FAILURES = (http.client.HTTPException, OSError, ValueError, BotoCoreError)


class _GetSigner:
    """SigV4 headers of a GET with no query string and no body, as botocore's ``S3SigV4Auth.add_auth`` gives
    them for an ``AWSRequest`` carrying only a User-Agent: signed headers ``host``, ``x-amz-content-sha256``
    (the empty body's digest: S3 signs the payload), ``x-amz-date`` and, with a session token,
    ``x-amz-security-token``. botocore derives the signing key with four HMACs on every request; it
    depends only on the secret, the day, the region and the service, so it is kept for the last pair."""

    def __init__(self, host: str, region: str, service: str):
        self._host, self._region, self._service = host, region, service
        self._key: tuple[str, str, bytes] | None = None  # (secret, day, signing key)

    def _signing_key(self, secret: str, day: str) -> bytes:
        cached = self._key
        if cached is not None and cached[0] == secret and cached[1] == day:
            return cached[2]
        key = f"AWS4{secret}".encode()
        for part in (day, self._region, self._service, "aws4_request"):
            key = hmac.new(key, part.encode(), hashlib.sha256).digest()
        self._key = (secret, day, key)
        return key

    def headers(self, path: str, credentials, amz_date: str | None = None) -> dict[str, str]:
        """The headers to send for ``GET path`` (already quoted, as on the wire) at ``amz_date`` (now)."""
        if amz_date is None:
            amz_date = get_current_datetime().strftime(SIGV4_TIMESTAMP)
        day = amz_date[:8]
        signed = {"host": self._host, "x-amz-content-sha256": EMPTY_SHA256_HASH, "x-amz-date": amz_date}
        if credentials.token:
            signed["x-amz-security-token"] = " ".join(credentials.token.split())  # SigV4's Trimall
        names = ";".join(signed)  # already in sorted order
        canonical = "\n".join(("GET", path, "", *(f"{k}:{v}" for k, v in signed.items()), "", names,
                                EMPTY_SHA256_HASH))
        scope = f"{day}/{self._region}/{self._service}/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        signature = hmac.new(self._signing_key(credentials.secret_key, day), to_sign.encode(),
                             hashlib.sha256).hexdigest()
        out = {"Host": self._host, "X-Amz-Date": amz_date, "X-Amz-Content-SHA256": EMPTY_SHA256_HASH,
               "Authorization": (f"AWS4-HMAC-SHA256 Credential={credentials.access_key}/{scope}, "
                                 f"SignedHeaders={names}, Signature={signature}")}
        if credentials.token:
            out["X-Amz-Security-Token"] = credentials.token
        return out


class _Connections:
    """Kept-alive connections to the bucket's host, at most ``size`` idle ones kept (LIFO). A connection is
    put back only after its answer was read to its end; one the server closed while idle is not reused."""

    def __init__(self, url: str, size: int, tls: ssl.SSLContext | None, connect_timeout, read_timeout):
        parts = urlsplit(url)
        self._host, self._port, self._tls = parts.hostname, parts.port, tls
        self._size, self._connect_timeout, self._read_timeout = size, connect_timeout, read_timeout
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        # Idle sockets are closed with the store, not left to the garbage collector's warnings.
        weakref.finalize(self, _close_all, self._idle)

    def take(self) -> http.client.HTTPConnection:
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                break
            if conn.sock is not None and not _readable(conn.sock):
                return conn
            conn.close()  # closed (or answered unasked) while idle
        if self._tls is None:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=self._connect_timeout)
        else:
            conn = http.client.HTTPSConnection(self._host, self._port, timeout=self._connect_timeout,
                                               context=self._tls)
        conn.connect()
        conn.sock.settimeout(self._read_timeout)
        return conn

    def give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if conn.sock is not None and len(self._idle) < self._size:
                self._idle.append(conn)
                return
        conn.close()


def _close_all(conns: list[http.client.HTTPConnection]) -> None:
    while conns:
        conns.pop().close()


def _readable(sock) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _tls_context(verify) -> ssl.SSLContext:
    """TLS as the client verifies it: botocore's CA bundle (or the one it was given), or none at all."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    where = get_cert_path(verify)
    return ssl.create_default_context(**({"capath": where} if os.path.isdir(where) else {"cafile": where}))


class SmallGets:
    """``get_bytes`` of small objects through a signed ``http.client`` request, with the store's
    ``get_bytes`` as the fallback for any answer but a plain 200. Thread-safe; ``pool_size`` idle
    connections are kept at most. ``fast`` and ``fallbacks`` count the reads each way took (reports and
    tests: a fast path that is never taken is not one)."""

    def __init__(self, client, bucket: str, *, user_agent: str, pool_size: int,
                 fallback: Callable[..., bytes]):
        self._client, self._bucket, self._pool_size = client, bucket, pool_size
        self._fallback = fallback
        self._user_agent = user_agent
        self._lock = threading.Lock()
        self.fast = 0
        self.fallbacks = 0
        # Prepared at the first read: most stores never read many small objects.
        self._prepared = False
        self._path: str | None = None  # the bucket's path on its host, no trailing /
        self._signer: _GetSigner | None = None
        self._pool: _Connections | None = None

    def _prepare(self) -> None:
        """The bucket's URL, the signer and the connections, when the client's requests can be reproduced
        exactly here (else the fast path stays off)."""
        client = self._client
        http_session = getattr(client._endpoint, "http_session", None)
        if (http_session is None or client._request_signer._credentials is None
                or getattr(http_session, "_cert_file", None)):
            return
        # The client's own URL for an object: addressing style and endpoint rules are botocore's.
        probe = client.generate_presigned_url("get_object", Params={"Bucket": self._bucket, "Key": _PROBE_KEY},
                                              ExpiresIn=60)
        url = probe.split("?", 1)[0]
        if not url.endswith("/" + _PROBE_KEY) or http_session._proxy_config.proxy_url_for(url) is not None:
            return
        base = url[:-len(_PROBE_KEY) - 1]
        meta, config = client.meta, client.meta.config
        tls = _tls_context(http_session._verify) if base.startswith("https://") else None
        self._path = urlsplit(base).path
        self._signer = _GetSigner(_host_from_url(base), meta.region_name, meta.service_model.signing_name or "s3")
        self._pool = _Connections(base, self._pool_size, tls, config.connect_timeout, config.read_timeout)

    def get_bytes(self, key: str, *, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        """The store's ``get_bytes(key)``: the same bytes, or the same error, from the fallback."""
        if not self._prepared:
            with self._lock:
                if not self._prepared:
                    self._prepare()
                    self._prepared = True
        data = self._fast(key, max_bytes) if self._pool is not None else None
        with self._lock:
            if data is None:
                self.fallbacks += 1
            else:
                self.fast += 1
        return data if data is not None else self._fallback(key, max_bytes=max_bytes)

    def _fast(self, key: str, max_bytes: int) -> bytes | None:
        """The object's bytes from one signed GET; None for any answer the fallback must give instead."""
        # botocore renders a key (a greedy URI label) with quote(safe="/~"); S3 signs the path as sent.
        path = f"{self._path}/{quote(key, safe='/~')}"
        conn = None
        complete = False
        try:
            frozen = self._client._request_signer._credentials.get_frozen_credentials()
            headers = self._signer.headers(path, frozen)
            headers["User-Agent"] = self._user_agent
            conn = self._pool.take()
            conn.request("GET", path, headers=headers)
            resp = conn.getresponse()
            length = resp.headers.get("Content-Length")
            if (resp.status != 200 or length is None or not length.isdigit() or int(length) > max_bytes
                    or any(h in resp.headers for h in _UNEXPECTED)):
                return None
            data = resp.read(int(length))
            complete = len(data) == int(length) and resp.isclosed()
            return data if complete else None
        except _FAILURES as exc:  # the fallback sends it again and reports what it finds
            log.debug("fast GET of %r not taken: %s", key, type(exc).__name__)
            return None
        finally:
            # Only a connection whose answer was read to its end goes back; any other is closed, so no
            # unread bytes can be taken for the next answer.
            if conn is not None:
                if complete:
                    self._pool.give_back(conn)
                else:
                    conn.close()
