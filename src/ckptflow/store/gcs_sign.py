"""Header-based request signing: GOOG4-HMAC-SHA256 (Cloud Storage XML API, HMAC keys) and AWS SigV4.

Google's V4 signing with an HMAC key is AWS Signature Version 4 with other names:

=====================  ============================  ==========================
                       Cloud Storage (``GOOG4``)     Amazon S3 (``AWS4``)
=====================  ============================  ==========================
algorithm              ``GOOG4-HMAC-SHA256``         ``AWS4-HMAC-SHA256``
signing-key prefix     ``"GOOG4" + secret``          ``"AWS4" + secret``
service in the scope   ``storage``                   ``s3``
scope terminator       ``goog4_request``             ``aws4_request``
date / payload header  ``x-goog-date``,              ``x-amz-date``,
                       ``x-goog-content-sha256``     ``x-amz-content-sha256``
=====================  ============================  ==========================

Both go through the one code path below, parameterised by a :class:`SigningScheme`; the tests check
the shared path against AWS's published SigV4 examples (an external known answer) and GOOG4 against a
step-by-step oracle written independently from the specification.

The steps (same for both):

1. canonical request = ``METHOD \\n canonical-URI \\n canonical-query \\n canonical-headers \\n
   signed-headers \\n payload-hash``, where the canonical URI percent-encodes every byte of the UTF-8
   path except the unreserved ``A-Z a-z 0-9 - . _ ~`` and ``/`` (no normalisation, no double
   encoding, as object stores require); the canonical query sorts the encoded ``name=value`` pairs;
   canonical headers are ``lowercase-name:trimmed-value\\n`` sorted by name (repeated names joined
   with ``,``; runs of spaces folded to one);
2. string to sign = ``ALGORITHM \\n YYYYMMDDTHHMMSSZ \\n date/region/service/terminator \\n
   hex(sha256(canonical request))``;
3. signing key = HMAC chain ``prefix+secret`` → date → region → service → terminator;
4. signature = hex(HMAC(signing key, string to sign)), sent as
   ``Authorization: ALGORITHM Credential=ACCESS/scope, SignedHeaders=a;b;c, Signature=hex``.

The clock is a parameter (``now``) so every function here is pure and testable. Nothing here logs, and
no returned object carries the secret.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from urllib.parse import quote

__all__ = [
    "AWS4",
    "EMPTY_SHA256",
    "GOOG4",
    "UNSIGNED_PAYLOAD",
    "SignedRequest",
    "SigningScheme",
    "authorization_header",
    "canonical_headers",
    "canonical_query_string",
    "canonical_request",
    "canonical_uri",
    "credential_scope",
    "format_timestamp",
    "hmac_sha256",
    "parse_authorization",
    "sign_request",
    "signature",
    "signing_key",
    "string_to_sign",
    "uri_encode",
]

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"

# Headers an HTTP client or proxy may add, drop or rewrite: never signed.
UNSIGNED_HEADERS = frozenset(
    {"authorization", "user-agent", "expect", "connection", "accept-encoding", "x-amzn-trace-id"}
)


@dataclass(frozen=True, slots=True)
class SigningScheme:
    """The names that distinguish GOOG4 from AWS4; the arithmetic is shared. The algorithm and the scope
    terminator are spelled from the key prefix in both specifications (``X-HMAC-SHA256``, ``x_request``)."""

    key_prefix: str
    service: str
    header_prefix: str

    @property
    def algorithm(self) -> str:
        return f"{self.key_prefix}-HMAC-SHA256"

    @property
    def terminator(self) -> str:
        return f"{self.key_prefix.lower()}_request"

    @property
    def date_header(self) -> str:
        return f"{self.header_prefix}-date"

    @property
    def content_sha256_header(self) -> str:
        return f"{self.header_prefix}-content-sha256"


GOOG4 = SigningScheme(key_prefix="GOOG4", service="storage", header_prefix="x-goog")
AWS4 = SigningScheme(key_prefix="AWS4", service="s3", header_prefix="x-amz")


# --------------------------------------------------------------------------------------------- pieces


def uri_encode(value: str, *, encode_slash: bool = True) -> str:
    """Percent-encode the UTF-8 bytes of ``value`` except unreserved characters (uppercase hex).

    ``encode_slash=False`` keeps ``/`` (object paths); query names and values encode it.
    """
    return quote(value, safe="-_.~" if encode_slash else "/-_.~", encoding="utf-8", errors="strict")


def canonical_uri(path: str) -> str:
    """The encoded path exactly as sent on the wire: ``/bucket/key`` with key bytes percent-encoded.

    ``path`` is the decoded path (a key may hold spaces, ``+``, ``%``, unicode …). An empty path is
    ``/``. Object stores compare the path literally, so there is no ``.``/``..`` normalisation.
    """
    if not path:
        return "/"
    if not path.startswith("/"):
        path = "/" + path
    return uri_encode(path, encode_slash=False)


QueryLike = Mapping[str, str | None] | Iterable[tuple[str, str | None]]


def _query_pairs(query: QueryLike | None) -> list[tuple[str, str]]:
    if query is None:
        return []
    items = query.items() if isinstance(query, Mapping) else query
    return [(str(k), "" if v is None else str(v)) for k, v in items]


def canonical_query_string(query: QueryLike | None) -> str:
    """``name=value`` pairs of the decoded query, each side encoded, sorted by name then value.

    A parameter without a value (``?uploads``) is ``uploads=``. Repeated names are all kept.
    """
    encoded = sorted((uri_encode(k), uri_encode(v)) for k, v in _query_pairs(query))
    return "&".join(f"{k}={v}" for k, v in encoded)


def _trim(value: str) -> str:
    return " ".join(str(value).split())


def canonical_headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> tuple[str, str]:
    """Return ``(canonical header block, signed header list)`` for the headers to sign.

    Names are lowercased and sorted; values trimmed with inner runs of whitespace folded to one
    space; repeated names joined with ``,`` in the order given. The block ends with a newline per
    header (``name:value\\n``).
    """
    items = headers.items() if isinstance(headers, Mapping) else headers
    merged: dict[str, list[str]] = {}
    for name, value in items:
        merged.setdefault(name.strip().lower(), []).append(_trim(value))
    names = sorted(merged)
    block = "".join(f"{n}:{','.join(merged[n])}\n" for n in names)
    return block, ";".join(names)


def canonical_request(
    method: str,
    path: str,
    query: QueryLike | None,
    headers: Mapping[str, str] | Iterable[tuple[str, str]],
    payload_sha256: str,
) -> str:
    """The canonical request of the spec (six parts joined by newlines)."""
    block, signed = canonical_headers(headers)
    return "\n".join(
        [
            method.upper(),
            canonical_uri(path),
            canonical_query_string(query),
            block,
            signed,
            payload_sha256,
        ]
    )


def _utc(now: datetime) -> datetime:
    if now.tzinfo is None:
        return now.replace(tzinfo=timezone.utc)
    return now.astimezone(timezone.utc)


def format_timestamp(now: datetime) -> tuple[str, str]:
    """``(YYYYMMDDTHHMMSSZ, YYYYMMDD)`` in UTC; a naive datetime is taken as UTC."""
    t = _utc(now)
    return t.strftime("%Y%m%dT%H%M%SZ"), t.strftime("%Y%m%d")


def credential_scope(scheme: SigningScheme, date: str, region: str) -> str:
    return f"{date}/{region}/{scheme.service}/{scheme.terminator}"


def string_to_sign(scheme: SigningScheme, timestamp: str, scope: str, canonical: str) -> str:
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()
    return f"{scheme.algorithm}\n{timestamp}\n{scope}\n{digest}"


def hmac_sha256(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode("utf-8"), hashlib.sha256).digest()


def signing_key(scheme: SigningScheme, secret: str, date: str, region: str) -> bytes:
    """kSigning = HMAC(HMAC(HMAC(HMAC(prefix + secret, date), region), service), terminator)."""
    k = hmac_sha256((scheme.key_prefix + secret).encode("utf-8"), date)
    k = hmac_sha256(k, region)
    k = hmac_sha256(k, scheme.service)
    return hmac_sha256(k, scheme.terminator)


def signature(key: bytes, to_sign: str) -> str:
    return hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()


def authorization_header(
    scheme: SigningScheme, access_key_id: str, scope: str, signed_headers: str, sig: str
) -> str:
    return (
        f"{scheme.algorithm} Credential={access_key_id}/{scope}, "
        f"SignedHeaders={signed_headers}, Signature={sig}"
    )


def parse_authorization(value: str) -> dict[str, str]:
    """Split an ``Authorization`` value into ``algorithm``, ``credential``, ``signedheaders``,
    ``signature`` (used by tests and diagnostics; it never sees the secret)."""
    algorithm, _, rest = value.strip().partition(" ")
    out = {"algorithm": algorithm}
    for part in rest.split(","):
        name, _, val = part.strip().partition("=")
        if name:
            out[name.lower()] = val
    return out


# --------------------------------------------------------------------------------------- the signer


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """A signed request, ready to send: the encoded path and the headers to put on the wire.

    ``headers`` holds the ``Authorization`` value (a bearer credential for a few minutes), so it is
    kept out of ``repr``; the secret itself is in nothing here.
    """

    method: str
    #: ``canonical_uri(path)``: send exactly this path so the server sees what was signed.
    encoded_path: str
    #: Canonical query string, also usable verbatim on the wire ("" when there is none).
    encoded_query: str
    headers: dict[str, str] = field(repr=False)
    signed_headers: str
    canonical_request: str
    string_to_sign: str
    signature: str = field(repr=False)


def sign_request(
    method: str,
    host: str,
    path: str,
    *,
    headers: Mapping[str, str] | None = None,
    query: QueryLike | None = None,
    payload_sha256: str,
    access_key_id: str,
    secret_access_key: str,
    region: str,
    now: datetime,
    scheme: SigningScheme = GOOG4,
) -> SignedRequest:
    """Sign one request with header-based authorization.

    ``host`` is the ``Host`` header value (``authority`` of the endpoint URL); ``path`` the decoded
    path (``/bucket/key``); ``headers`` the extra headers to send, all of which are signed except
    the hop-by-hop/client ones in :data:`UNSIGNED_HEADERS`. The scheme's date and payload-hash
    headers (``x-goog-date``, ``x-goog-content-sha256``) are set here from ``now`` and
    ``payload_sha256``; ``Host`` is set from ``host`` unless ``headers`` already holds one.
    """
    timestamp, date = format_timestamp(now)
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if name.lower() in (scheme.date_header, scheme.content_sha256_header, "authorization"):
            continue
        out[name] = str(value)
    if not any(n.lower() == "host" for n in out):
        out = {"Host": host, **out}
    out[scheme.content_sha256_header] = payload_sha256
    out[scheme.date_header] = timestamp

    to_sign = [(n, v) for n, v in out.items() if n.lower() not in UNSIGNED_HEADERS]
    canonical = canonical_request(method, path, query, to_sign, payload_sha256)
    _, signed = canonical_headers(to_sign)
    scope = credential_scope(scheme, date, region)
    sts = string_to_sign(scheme, timestamp, scope, canonical)
    sig = signature(signing_key(scheme, secret_access_key, date, region), sts)
    out["Authorization"] = authorization_header(scheme, access_key_id, scope, signed, sig)
    return SignedRequest(
        method=method.upper(),
        encoded_path=canonical_uri(path),
        encoded_query=canonical_query_string(query),
        headers=out,
        signed_headers=signed,
        canonical_request=canonical,
        string_to_sign=sts,
        signature=sig,
    )
