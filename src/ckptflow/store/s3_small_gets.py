"""Many small whole-object GETs (records: one declaration per artifact in ``ls``) on an S3 store, without
botocore's per-request machinery: ``SmallGets``, the store's ``small_gets`` capability.

A GET through a botocore client costs about 0.7 ms of CPU (event hooks, endpoint rules, parameter
validation, response parsing) where the request itself is a few headers. The fast path here signs each
GET with botocore's own SigV4 signer (``S3SigV4Auth``, with the client's current credentials, which may
refresh, and its region and signing name), at the URL the client itself gives for the object (the
bucket's URL is taken once from a presigned URL of the client, so path-style or virtual-host addressing
and endpoint rules are the client's; keys are quoted as botocore quotes them), and sends it on one
urllib3 pool that verifies TLS exactly as the client does.

Only a ``200`` whose body has exactly its ``Content-Length`` of at most ``max_bytes`` bytes is taken from
the fast path. Anything else (404, 403, 5xx, a redirect, a connection error, a body that breaks off or is
too large, a header we do not expect) sends that key again through the store's normal ``get_bytes``,
which has the retries, the error mapping and the retry announcement. So the fast path can only make a
read faster, never change its outcome. A client the fast path cannot reproduce exactly (a proxy, a client
certificate, no credentials) never uses it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from urllib.parse import quote

import urllib3
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.exceptions import BotoCoreError
from botocore.httpsession import get_cert_path

log = logging.getLogger(__name__)

# Headers whose presence means the body may not be the object's bytes as botocore would return them.
_UNEXPECTED = ("content-encoding", "content-range", "transfer-encoding")
_PROBE_KEY = "ckptflow-url-probe"
_FAILURES = (urllib3.exceptions.HTTPError, OSError, ValueError, BotoCoreError)


class SmallGets:
    """``get_bytes`` of small objects through a signed urllib3 request, with the store's ``get_bytes`` as the
    fallback for any answer but a plain 200. Thread-safe. ``fast`` and ``fallbacks`` count the reads each
    way took (reports and tests: a fast path that is never taken is not one)."""

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
        self._base: str | None = None
        self._pool: urllib3.PoolManager | None = None

    @staticmethod
    def _prepare(client, bucket: str, pool_size: int) -> tuple[str | None, urllib3.PoolManager | None]:
        """The bucket's URL (no trailing ``/``) and a pool sending as the client does; ``(None, None)`` when
        the client's requests cannot be reproduced exactly here."""
        http = getattr(client._endpoint, "http_session", None)
        signer = client._request_signer
        if http is None or signer._credentials is None or getattr(http, "_cert_file", None):
            return None, None
        # The client's own URL for an object: addressing style and endpoint rules are botocore's.
        probe = client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": _PROBE_KEY},
                                              ExpiresIn=60)
        url = probe.split("?", 1)[0]
        if not url.endswith("/" + _PROBE_KEY) or http._proxy_config.proxy_url_for(url) is not None:
            return None, None
        config = client.meta.config
        timeout = urllib3.Timeout(connect=config.connect_timeout, read=config.read_timeout)
        kwargs = {"maxsize": pool_size, "block": False, "timeout": timeout, "retries": False}
        if url.startswith("https://"):
            verify = http._verify
            kwargs.update({"cert_reqs": "CERT_NONE"} if verify is False
                          else {"cert_reqs": "CERT_REQUIRED", "ca_certs": get_cert_path(verify)})
        return url[:-len(_PROBE_KEY) - 1], urllib3.PoolManager(**kwargs)

    def get_bytes(self, key: str, *, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        """The store's ``get_bytes(key)``: the same bytes, or the same error, from the fallback."""
        with self._lock:
            if not self._prepared:
                self._base, self._pool = self._prepare(self._client, self._bucket, self._pool_size)
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
        # botocore renders a key (a greedy URI label) with quote(safe="/~").
        url = f"{self._base}/{quote(key, safe='/~')}"
        try:
            frozen = self._client._request_signer._credentials.get_frozen_credentials()
            meta = self._client.meta
            request = AWSRequest(method="GET", url=url, headers={"User-Agent": self._user_agent})
            S3SigV4Auth(frozen, meta.service_model.signing_name or "s3", meta.region_name).add_auth(request)
            resp = self._pool.request("GET", url, headers=dict(request.headers.items()), redirect=False,
                                      preload_content=False, decode_content=False)
        except _FAILURES as exc:  # the fallback sends it again and reports what it finds
            log.debug("fast GET of %r not taken: %s", key, type(exc).__name__)
            return None
        complete = False
        try:
            length = resp.headers.get("Content-Length")
            if (resp.status != 200 or length is None or not length.isdigit() or int(length) > max_bytes
                    or any(h in resp.headers for h in _UNEXPECTED)):
                return None
            data = resp.read(int(length) + 1, decode_content=False)
            complete = len(data) == int(length)
            return data if complete else None
        except _FAILURES as exc:  # a body that broke off: the fallback reads it again
            log.debug("fast GET of %r broke off: %s", key, type(exc).__name__)
            return None
        finally:
            # Only a connection whose answer was read to its end goes back to the pool; any other is closed,
            # so no unread bytes can be taken for the next answer.
            if complete:
                resp.release_conn()
            else:
                resp.close()
