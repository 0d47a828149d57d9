"""Known answers for the GOOG4-HMAC-SHA256 / AWS SigV4 signer in ``ckptflow.store.gcs_sign``.

Two kinds of oracle, both independent of the implementation's code:

* AWS's published Signature Version 4 examples for S3 (header-based auth, examplebucket,
  AKIAIOSFODNN7EXAMPLE, 20130524T000000Z). The signer run with the AWS4 names must reproduce their
  signatures exactly: an external known answer for the code path GOOG4 shares.
* A GOOG4 request spelled out by hand from Google's V4 signing description: the canonical request and
  the string to sign are literal strings in this file, and the signing key is derived here step by step
  with ``hmac``/``hashlib``.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime, timedelta, timezone

import pytest

from ckptflow.store import gcs_sign
from ckptflow.store.gcs_sign import AWS4, EMPTY_SHA256, GOOG4

# ------------------------------------------------------------------ AWS SigV4 published examples

AWS_ACCESS = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
AWS_HOST = "examplebucket.s3.amazonaws.com"
AWS_NOW = datetime(2013, 5, 24, 0, 0, 0, tzinfo=timezone.utc)


def _aws(method, path, *, headers=None, query=None, payload=EMPTY_SHA256):
    return gcs_sign.sign_request(
        method,
        AWS_HOST,
        path,
        headers=headers,
        query=query,
        payload_sha256=payload,
        access_key_id=AWS_ACCESS,
        secret_access_key=AWS_SECRET,
        region="us-east-1",
        now=AWS_NOW,
        scheme=AWS4,
    )


def test_aws4_scheme_names():
    assert (AWS4.algorithm, AWS4.key_prefix, AWS4.service, AWS4.terminator, AWS4.header_prefix) == (
        "AWS4-HMAC-SHA256",
        "AWS4",
        "s3",
        "aws4_request",
        "x-amz",
    )
    assert (GOOG4.algorithm, GOOG4.key_prefix, GOOG4.service, GOOG4.terminator, GOOG4.header_prefix) == (
        "GOOG4-HMAC-SHA256",
        "GOOG4",
        "storage",
        "goog4_request",
        "x-goog",
    )


def test_aws_example_get_object_with_range():
    # AWS S3 API reference, "Signature Calculations for the Authorization Header", Example: GET Object.
    signed = _aws("GET", "/test.txt", headers={"Range": "bytes=0-9"})
    assert signed.canonical_request == (
        "GET\n"
        "/test.txt\n"
        "\n"
        "host:examplebucket.s3.amazonaws.com\n"
        "range:bytes=0-9\n"
        "x-amz-content-sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\n"
        "x-amz-date:20130524T000000Z\n"
        "\n"
        "host;range;x-amz-content-sha256;x-amz-date\n"
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert signed.string_to_sign == (
        "AWS4-HMAC-SHA256\n"
        "20130524T000000Z\n"
        "20130524/us-east-1/s3/aws4_request\n"
        "7344ae5b7ee6c3e7e6b0fe0640412a37625d1fbfff95c48bbb2dc43964946972"
    )
    assert signed.signature == "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    assert signed.headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert signed.headers["x-amz-date"] == "20130524T000000Z"
    assert signed.headers["x-amz-content-sha256"] == EMPTY_SHA256


def test_aws_example_put_object_encodes_dollar_in_key():
    # Example: PUT Object "test$file.text" with body "Welcome to Amazon S3."
    payload = hashlib.sha256(b"Welcome to Amazon S3.").hexdigest()
    assert payload == "44ce7dd67c959e0d3524ffac1771dfbba87d2b6b4b4e99e42034a8b803f8b072"
    signed = _aws(
        "PUT",
        "/test$file.text",
        headers={"Date": "Fri, 24 May 2013 00:00:00 GMT", "x-amz-storage-class": "REDUCED_REDUNDANCY"},
        payload=payload,
    )
    assert signed.encoded_path == "/test%24file.text"
    assert signed.signed_headers == "date;host;x-amz-content-sha256;x-amz-date;x-amz-storage-class"
    assert signed.signature == "98ad721746da40c64f1a55b78f14c238d841ea1380cd77a1b5971af0ece108bd"


def test_aws_example_get_bucket_lifecycle_valueless_query():
    # Example: GET Bucket Lifecycle, "?lifecycle" canonicalises to "lifecycle=".
    signed = _aws("GET", "/", query={"lifecycle": None})
    assert signed.canonical_request.split("\n")[2] == "lifecycle="
    assert signed.signature == "fea454ca298b7da1c68078a5d1bdbfbbe0d65c699e0f91ac7a200a0136783543"


def test_aws_example_list_objects_sorted_query():
    # Example: Get Bucket (List Objects) "?max-keys=2&prefix=J", given here in the other order.
    signed = _aws("GET", "/", query=[("prefix", "J"), ("max-keys", "2")])
    assert signed.encoded_query == "max-keys=2&prefix=J"
    assert signed.signature == "34b48302e7b5fa45bde8084f4b7868a86f0a534bc59db6670ed5711ef69dc6f7"


def test_botocore_sigv4_agrees_on_awkward_key_and_query():
    """A second, independent SigV4 implementation (botocore's) agrees on a key that needs encoding."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    body = b"payload bytes\n"
    payload = hashlib.sha256(body).hexdigest()
    key_path = "/bucket/dir with space/caf\u00e9 \u6f22\u5b57~x+y=z&(1)*.json"
    query = [("uploadId", "a/b c+d"), ("partNumber", "2"), ("acl", None)]
    mine = _aws(
        "PUT",
        key_path,
        headers={"Content-Type": "application/json", "x-amz-meta-sha256": payload},
        query=query,
        payload=payload,
    )
    url = f"https://{AWS_HOST}{mine.encoded_path}?{mine.encoded_query}"
    request = AWSRequest(
        method="PUT",
        url=url,
        data=body,
        headers={
            "Content-Type": "application/json",
            "x-amz-meta-sha256": payload,
            "X-Amz-Content-SHA256": payload,
            "X-Amz-Date": "20130524T000000Z",
        },
    )
    request.context["timestamp"] = "20130524T000000Z"
    auth = S3SigV4Auth(Credentials(AWS_ACCESS, AWS_SECRET), "s3", "us-east-1")
    canonical = auth.canonical_request(request)
    assert canonical == mine.canonical_request
    assert auth.signature(auth.string_to_sign(request, canonical), request) == mine.signature


# ------------------------------------------------------------------ GOOG4, spelled out by hand

G_ACCESS = "GOOG1EXAMPLEACCESSIDFORCKPTFLOWTESTS0000000000000000000000"
G_SECRET = "bGoa+V7g/yqDXvKRqq+JTFn4uQZbPiQJo4pf9RzJ"
G_NOW = datetime(2024, 3, 9, 17, 5, 42, tzinfo=timezone.utc)
G_BODY = b'{"schema": "posttrain.artifact-archive.v1"}\n'


def test_goog4_put_create_once_step_by_step():
    payload = hashlib.sha256(G_BODY).hexdigest()
    signed = gcs_sign.sign_request(
        "PUT",
        "storage.googleapis.com",
        "/ckpt-bucket/runs/run 1/iter_0000300/.posttrain-archive.json",
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Length": str(len(G_BODY)),
            "x-goog-if-generation-match": "0",
            "x-goog-meta-sha256": payload,
        },
        payload_sha256=payload,
        access_key_id=G_ACCESS,
        secret_access_key=G_SECRET,
        region="auto",
        now=G_NOW,
    )

    # 1. Canonical request, written out literally.
    expected_canonical = f"""PUT
/ckpt-bucket/runs/run%201/iter_0000300/.posttrain-archive.json

content-length:{len(G_BODY)}
content-type:application/octet-stream
host:storage.googleapis.com
x-goog-content-sha256:{payload}
x-goog-date:20240309T170542Z
x-goog-if-generation-match:0
x-goog-meta-sha256:{payload}

content-length;content-type;host;x-goog-content-sha256;x-goog-date;x-goog-if-generation-match;x-goog-meta-sha256
{payload}"""
    assert signed.canonical_request == expected_canonical

    # 2. String to sign.
    canonical_hash = hashlib.sha256(expected_canonical.encode()).hexdigest()
    expected_sts = (
        "GOOG4-HMAC-SHA256\n20240309T170542Z\n20240309/auto/storage/goog4_request\n" + canonical_hash
    )
    assert signed.string_to_sign == expected_sts

    # 3. Signing key: HMAC chain from "GOOG4" + secret.
    k_date = hmac.new(b"GOOG4" + G_SECRET.encode(), b"20240309", hashlib.sha256).digest()
    k_region = hmac.new(k_date, b"auto", hashlib.sha256).digest()
    k_service = hmac.new(k_region, b"storage", hashlib.sha256).digest()
    k_signing = hmac.new(k_service, b"goog4_request", hashlib.sha256).digest()
    assert gcs_sign.signing_key(GOOG4, G_SECRET, "20240309", "auto") == k_signing

    # 4. Signature and header.
    expected_sig = hmac.new(k_signing, expected_sts.encode(), hashlib.sha256).hexdigest()
    assert signed.signature == expected_sig
    assert signed.headers["Authorization"] == (
        f"GOOG4-HMAC-SHA256 Credential={G_ACCESS}/20240309/auto/storage/goog4_request, "
        "SignedHeaders=content-length;content-type;host;x-goog-content-sha256;x-goog-date;"
        f"x-goog-if-generation-match;x-goog-meta-sha256, Signature={expected_sig}"
    )
    assert signed.headers["x-goog-date"] == "20240309T170542Z"
    assert signed.headers["x-goog-content-sha256"] == payload
    assert signed.headers["Host"] == "storage.googleapis.com"
    assert not [h for h in signed.headers if h.lower().startswith("x-amz-")]
    # The secret is an input of the key derivation only.
    assert G_SECRET not in repr(signed)
    assert all(G_SECRET not in v for v in signed.headers.values())
    assert G_SECRET not in signed.canonical_request + signed.string_to_sign


def test_goog4_and_aws4_differ_only_in_names():
    common = dict(
        payload_sha256=EMPTY_SHA256,
        access_key_id="id",
        secret_access_key="secret",
        region="auto",
        now=G_NOW,
    )
    g = gcs_sign.sign_request("GET", "h", "/b/k", **common, scheme=GOOG4)
    a = gcs_sign.sign_request("GET", "h", "/b/k", **common, scheme=AWS4)
    assert g.canonical_request.replace("x-goog-", "x-amz-") == a.canonical_request
    assert g.signature != a.signature


def test_signer_owns_date_and_payload_headers_and_skips_client_headers():
    signed = gcs_sign.sign_request(
        "PUT",
        "h:8080",
        "/b/k",
        headers={
            "X-Goog-Date": "19990101T000000Z",
            "x-goog-content-sha256": "stale",
            "Authorization": "stale",
            "User-Agent": "python-requests/2",
        },
        payload_sha256=EMPTY_SHA256,
        access_key_id="id",
        secret_access_key="secret",
        region="auto",
        now=G_NOW,
    )
    assert signed.headers["x-goog-date"] == "20240309T170542Z"
    assert signed.headers["x-goog-content-sha256"] == EMPTY_SHA256
    assert "X-Goog-Date" not in signed.headers
    assert signed.headers["Authorization"].startswith("GOOG4-HMAC-SHA256 ")
    assert signed.signed_headers == "host;x-goog-content-sha256;x-goog-date"
    assert "host:h:8080\n" in signed.canonical_request


def test_explicit_host_header_is_kept():
    signed = gcs_sign.sign_request(
        "GET",
        "ignored",
        "/b/k",
        headers={"host": "example.org:9000"},
        payload_sha256=EMPTY_SHA256,
        access_key_id="id",
        secret_access_key="secret",
        region="auto",
        now=G_NOW,
    )
    assert "host:example.org:9000\n" in signed.canonical_request
    assert "Host" not in signed.headers


# ------------------------------------------------------------------ timestamps


@pytest.mark.parametrize(
    "now",
    [
        datetime(2024, 3, 9, 17, 5, 42, tzinfo=timezone.utc),
        datetime(2024, 3, 9, 17, 5, 42),  # naive: taken as UTC
        datetime(2024, 3, 9, 19, 5, 42, tzinfo=timezone(timedelta(hours=2))),
        datetime(2024, 3, 9, 17, 5, 42, 999999, tzinfo=timezone.utc),
    ],
)
def test_format_timestamp_is_utc(now):
    assert gcs_sign.format_timestamp(now) == ("20240309T170542Z", "20240309")


def test_scope_date_follows_utc_across_midnight():
    late = datetime(2024, 3, 10, 0, 30, tzinfo=timezone(timedelta(hours=1)))  # 23:30 UTC on the 9th
    assert gcs_sign.format_timestamp(late) == ("20240309T233000Z", "20240309")


# ------------------------------------------------------------------ URI encoding


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/b/plain-key_1.2~3", "/b/plain-key_1.2~3"),
        ("/b/with space", "/b/with%20space"),
        ("/b/tilde~stays", "/b/tilde~stays"),
        ("/b/caf\u00e9", "/b/caf%C3%A9"),
        ("/b/\u6f22\u5b57", "/b/%E6%BC%A2%E5%AD%97"),
        ("/b/\U0001f600", "/b/%F0%9F%98%80"),
        ("/b/a+b=c&d", "/b/a%2Bb%3Dc%26d"),
        ("/b/100%", "/b/100%25"),
        ("/b/already%20encoded", "/b/already%2520encoded"),  # never double-decoded
        ("/b/star*(x)!'", "/b/star%2A%28x%29%21%27"),
        ("/b/dir/./../x", "/b/dir/./../x"),  # no normalisation for object stores
        ("/b/dir//x/", "/b/dir//x/"),
        ("/b/co:lon;semi,comma@at$", "/b/co%3Alon%3Bsemi%2Ccomma%40at%24"),
        ("", "/"),
        ("b/k", "/b/k"),
    ],
)
def test_canonical_uri(path, expected):
    assert gcs_sign.canonical_uri(path) == expected


def test_uri_encode_slash_only_kept_in_paths():
    assert gcs_sign.uri_encode("a/b c~") == "a%2Fb%20c~"
    assert gcs_sign.uri_encode("a/b c~", encode_slash=False) == "a/b%20c~"
    assert gcs_sign.uri_encode("AZaz09-._~") == "AZaz09-._~"


# ------------------------------------------------------------------ query canonicalisation


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (None, ""),
        ({}, ""),
        ({"uploads": None}, "uploads="),
        ({"uploads": ""}, "uploads="),
        ([("prefix", "J"), ("max-keys", "2")], "max-keys=2&prefix=J"),
        # Repeated names: all kept, sorted by value.
        ([("k", "b"), ("k", "a"), ("j", "z")], "j=z&k=a&k=b"),
        # Values (and names) encode "/" and space; "~" stays.
        ({"prefix": "runs/run 1/~x", "delimiter": "/"}, "delimiter=%2F&prefix=runs%2Frun%201%2F~x"),
        # Sorting is by code point of the encoded name: uppercase before lowercase.
        ([("b", "1"), ("B", "2"), ("a", "3")], "B=2&a=3&b=1"),
        # Sorting happens after encoding: "%20" (space) sorts before "-".
        ([("a-b", "1"), ("a b", "2")], "a%20b=2&a-b=1"),
        ({"x-goog-signature": "a+b=c"}, "x-goog-signature=a%2Bb%3Dc"),
        ({"n": "caf\u00e9"}, "n=caf%C3%A9"),
    ],
)
def test_canonical_query_string(query, expected):
    assert gcs_sign.canonical_query_string(query) == expected


# ------------------------------------------------------------------ canonical headers


def test_canonical_headers_lowercase_sorted_trimmed():
    block, signed = gcs_sign.canonical_headers(
        [
            ("X-Goog-Meta-Note", "  two   spaces\tand tab  "),
            ("Host", "storage.googleapis.com"),
            ("x-goog-meta-multi", "first"),
            ("X-GOOG-META-MULTI", "second"),
            ("Content-Type", "application/octet-stream"),
        ]
    )
    assert block == (
        "content-type:application/octet-stream\n"
        "host:storage.googleapis.com\n"
        "x-goog-meta-multi:first,second\n"
        "x-goog-meta-note:two spaces and tab\n"
    )
    assert signed == "content-type;host;x-goog-meta-multi;x-goog-meta-note"


def test_parse_authorization_roundtrip():
    value = gcs_sign.authorization_header(GOOG4, "ACCESS", "20240309/auto/storage/goog4_request", "a;b", "ff")
    assert gcs_sign.parse_authorization(value) == {
        "algorithm": "GOOG4-HMAC-SHA256",
        "credential": "ACCESS/20240309/auto/storage/goog4_request",
        "signedheaders": "a;b",
        "signature": "ff",
    }
