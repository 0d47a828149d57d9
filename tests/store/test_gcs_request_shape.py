"""The shape of GCSStore's create-once PUT, checked against a recording HTTP server on loopback.

The server stands in for the GCS XML API only as far as this test needs: it records every request and
answers 200 for the first create of a key and 412 afterwards (what ``x-goog-if-generation-match: 0``
does on real GCS). Whether a real endpoint enforces the precondition is what ``ckptflow probe``
qualifies; fake-gcs-server ignores it on XML PUT, so it cannot be checked offline.
"""

from __future__ import annotations

import hashlib
import logging
import re
import socket
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

import pytest

from ckptflow.errors import InvalidRecord, StoreError, UsageError
from ckptflow.store import gcs_sign
from ckptflow.store.credentials import Credentials
from ckptflow.store.gcs import GCSStore

BUCKET = "ckpt-bucket"
ACCESS = "GOOG1ETESTACCESSIDFORCKPTFLOW"
SECRET = "s3cr3t/HMAC+never=shown-anywhere"
NOW = datetime(2024, 3, 9, 17, 5, 42, tzinfo=timezone.utc)


class _Recorder:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.objects: dict[str, bytes] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        # Statuses answered, in order, before the normal behaviour (to inject failures).
        self.script: list[tuple[int, dict[str, str]]] = []
        # Header family HEAD uses to report custom metadata ("x-goog-meta-" or "x-amz-meta-").
        self.meta_family = "x-goog-meta-"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # keep test output quiet
        pass

    def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None):
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def do_PUT(self):
        rec: _Recorder = self.server.recorder  # type: ignore[attr-defined]
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with rec.lock:
            rec.requests.append(
                {"method": "PUT", "path": self.path, "headers": list(self.headers.items()), "body": body}
            )
            if rec.script:
                status, extra = rec.script.pop(0)
                code = {403: "AccessDenied", 500: "InternalError", 503: "SlowDown"}.get(status, "Error")
                self._answer(status, f"<Error><Code>{code}</Code></Error>".encode(), extra)
                return
            if self.path in rec.objects and self.headers.get("x-goog-if-generation-match") == "0":
                self._answer(412, b"<Error><Code>PreconditionFailed</Code></Error>")
                return
            rec.objects[self.path] = body
            rec.metadata[self.path] = {
                n.lower()[len("x-goog-meta-") :]: v
                for n, v in self.headers.items()
                if n.lower().startswith("x-goog-meta-")
            }
        self._answer(200, headers={"ETag": '"' + hashlib.md5(body).hexdigest() + '"'})

    def do_HEAD(self):
        rec: _Recorder = self.server.recorder  # type: ignore[attr-defined]
        with rec.lock:
            rec.requests.append({"method": "HEAD", "path": self.path, "headers": list(self.headers.items())})
            body = rec.objects.get(self.path)
            meta = dict(rec.metadata.get(self.path, {}))
        if body is None:
            self._answer(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("ETag", '"' + hashlib.md5(body).hexdigest() + '"')
        self.send_header("Last-Modified", "Sat, 09 Mar 2024 17:05:42 GMT")
        for name, value in meta.items():
            self.send_header(rec.meta_family + name, value)
        self.end_headers()


@pytest.fixture
def server(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    httpd.recorder = _Recorder()  # type: ignore[attr-defined]
    thread = threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="fake-gcs-xml", daemon=True
    )
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture
def sleeps():
    return []


@pytest.fixture
def store(server, sleeps):
    port = server.server_address[1]
    creds = Credentials(
        aws_access_key_id=ACCESS,
        aws_secret_access_key=SECRET,
        endpoint_url=f"http://127.0.0.1:{port}",
        region_name=None,
    )
    return GCSStore(BUCKET, creds, clock=lambda: NOW, sleep=sleeps.append, max_attempts=3)


def _headers(req) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in req["headers"]:
        out[name.lower()] = value
    return out


def _reverify(req) -> bool:
    """Re-sign the request as received (same secret, same clock) and compare signatures."""
    h = _headers(req)
    auth = gcs_sign.parse_authorization(h["authorization"])
    date = h["x-goog-date"][:8]
    access, scope = auth["credential"].split("/", 1)
    assert access == ACCESS
    assert scope == f"{date}/auto/storage/goog4_request"
    signed_names = auth["signedheaders"].split(";")
    canonical = gcs_sign.canonical_request(
        req["method"],
        unquote(req["path"]),
        None,
        [(n, h[n]) for n in signed_names],
        h["x-goog-content-sha256"],
    )
    sts = gcs_sign.string_to_sign(gcs_sign.GOOG4, h["x-goog-date"], scope, canonical)
    expected = gcs_sign.signature(gcs_sign.signing_key(gcs_sign.GOOG4, SECRET, date, "auto"), sts)
    return expected == auth["signature"]


def _no_secret(text: str) -> None:
    assert SECRET not in text
    assert "Signature=" not in text
    assert "GOOG4-HMAC-SHA256 Credential" not in text


def _exc_texts(exc: BaseException) -> str:
    texts = []
    seen: BaseException | None = exc
    while seen is not None:
        texts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    return "\n".join(texts)


def test_create_once_request_shape(server, store, caplog):
    caplog.set_level(logging.DEBUG)
    data = b'{"schema": "posttrain.artifact-archive.v1"}\n'
    digest = hashlib.sha256(data).hexdigest()
    key = "runs/r1/iter_0000300/.posttrain-archive.json"

    assert store.put_bytes_create_once(key, data, sha256=digest) is True

    [req] = server.recorder.requests
    h = _headers(req)
    assert req["method"] == "PUT"
    assert req["path"] == f"/{BUCKET}/{key}"
    assert req["body"] == data
    assert h["x-goog-if-generation-match"] == "0"
    assert h["x-goog-meta-sha256"] == digest
    assert h["x-goog-content-sha256"] == hashlib.sha256(req["body"]).hexdigest()
    assert h["x-goog-date"] == "20240309T170542Z"
    assert h["content-type"] == "application/octet-stream"
    assert h["content-length"] == str(len(data))
    assert h["host"] == f"127.0.0.1:{server.server_address[1]}"
    assert not [n for n in h if n.startswith("x-amz-")]

    auth = h["authorization"]
    m = re.fullmatch(
        rf"GOOG4-HMAC-SHA256 Credential={ACCESS}/20240309/auto/storage/goog4_request, "
        r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})",
        auth,
    )
    assert m, auth
    signed = m.group(1).split(";")
    assert signed == sorted(signed)
    for required in (
        "host",
        "x-goog-content-sha256",
        "x-goog-date",
        "x-goog-if-generation-match",
        "x-goog-meta-sha256",
    ):
        assert required in signed
    assert _reverify(req)

    for name, value in req["headers"]:
        assert SECRET not in name and SECRET not in value
    _no_secret(caplog.text)
    assert SECRET not in repr(store)


def test_signature_check_is_not_vacuous(server, store):
    data = b"x"
    store.put_bytes_create_once("k", data, sha256=hashlib.sha256(data).hexdigest())
    [req] = server.recorder.requests
    tampered = dict(req, path=f"/{BUCKET}/other-key")
    assert _reverify(req)
    assert not _reverify(tampered)


def test_awkward_key_sent_exactly_as_signed(server, store):
    data = b"payload"
    key = "runs/run 1/caf\u00e9/\u6f22\u5b57~v+1=2&(x).json"
    assert store.put_bytes_create_once(key, data, sha256=hashlib.sha256(data).hexdigest()) is True
    [req] = server.recorder.requests
    assert req["path"] == (f"/{BUCKET}/runs/run%201/caf%C3%A9/%E6%BC%A2%E5%AD%97~v%2B1%3D2%26%28x%29.json")
    assert unquote(req["path"]) == f"/{BUCKET}/{key}"
    assert _reverify(req)


def test_second_create_is_refused(server, store):
    first, second = b"first\n", b"second\n"
    assert store.put_bytes_create_once("k/decl.json", first, sha256=hashlib.sha256(first).hexdigest())
    assert (
        store.put_bytes_create_once("k/decl.json", second, sha256=hashlib.sha256(second).hexdigest()) is False
    )
    assert len(server.recorder.requests) == 2
    assert server.recorder.objects[f"/{BUCKET}/k/decl.json"] == first
    assert all(_headers(r)["x-goog-if-generation-match"] == "0" for r in server.recorder.requests)


def test_server_error_is_retried(server, store, sleeps):
    server.recorder.script = [(500, {})]
    data = b"retry me"
    assert store.put_bytes_create_once("k", data, sha256=hashlib.sha256(data).hexdigest()) is True
    assert len(server.recorder.requests) == 2
    assert len(sleeps) == 1 and 0 < sleeps[0] <= 8
    assert all(_reverify(r) for r in server.recorder.requests)


def test_rate_limit_honours_retry_after(server, store, sleeps):
    server.recorder.script = [(429, {"Retry-After": "3"})]
    data = b"slow down"
    assert store.put_bytes_create_once("k", data, sha256=hashlib.sha256(data).hexdigest()) is True
    assert sleeps == [3.0]


def test_retries_are_bounded(server, store, sleeps):
    server.recorder.script = [(503, {})] * 5
    data = b"never"
    with pytest.raises(StoreError) as info:
        store.put_bytes_create_once("k/x", data, sha256=hashlib.sha256(data).hexdigest())
    assert len(server.recorder.requests) == 3  # max_attempts
    assert len(sleeps) == 2
    text = _exc_texts(info.value)
    assert "503" in text and f"gs://{BUCKET}/k/x" in text and "3 attempts" in text
    _no_secret(text)


def test_forbidden_is_a_store_error_without_secret(server, store, sleeps, caplog):
    caplog.set_level(logging.DEBUG)
    server.recorder.script = [(403, {})]
    data = b"denied"
    with pytest.raises(StoreError) as info:
        store.put_bytes_create_once("runs/r1/manifest.json", data, sha256=hashlib.sha256(data).hexdigest())
    assert len(server.recorder.requests) == 1  # not retried
    assert sleeps == []
    text = _exc_texts(info.value)
    assert BUCKET in text and "runs/r1/manifest.json" in text and "403" in text
    assert "AccessDenied" in text
    assert isinstance(info.value, OSError)
    _no_secret(text)
    _no_secret(caplog.text)


def test_unreachable_endpoint_is_a_store_error_without_secret(sleeps, caplog, monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    caplog.set_level(logging.DEBUG)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    creds = Credentials(
        aws_access_key_id=ACCESS, aws_secret_access_key=SECRET, endpoint_url=f"http://127.0.0.1:{port}"
    )
    store = GCSStore(BUCKET, creds, clock=lambda: NOW, sleep=sleeps.append, max_attempts=2)
    data = b"nobody home"
    with pytest.raises(StoreError) as info:
        store.put_bytes_create_once("k", data, sha256=hashlib.sha256(data).hexdigest())
    assert len(sleeps) == 1
    text = _exc_texts(info.value)
    assert f"gs://{BUCKET}/k" in text
    _no_secret(text)
    _no_secret(caplog.text)


def test_digest_and_key_are_checked_before_anything_is_sent(server, store):
    with pytest.raises(UsageError):
        store.put_bytes_create_once("k", b"abc", sha256=hashlib.sha256(b"abd").hexdigest())
    with pytest.raises(UsageError):
        store.put_bytes_create_once("k", b"abc", sha256=hashlib.sha256(b"abc").hexdigest().upper())
    for bad in ("../escape", "/abs", "a//b", "a/./b", ""):
        with pytest.raises(InvalidRecord):
            store.put_bytes_create_once(bad, b"abc", sha256=hashlib.sha256(b"abc").hexdigest())
    assert server.recorder.requests == []


def test_default_endpoint_and_destination():
    creds = Credentials(aws_access_key_id=ACCESS, aws_secret_access_key=SECRET, endpoint_url=None)
    store = GCSStore(BUCKET, creds)
    assert store.endpoint_url == "https://storage.googleapis.com"
    assert store.destination.as_dict() == {
        "scheme": "gs",
        "endpoint": "storage.googleapis.com",
        "bucket": BUCKET,
    }
    assert store.supports_checksum_sha256 is False
    assert SECRET not in repr(store)


def test_endpoint_path_prefix_is_kept(server, sleeps):
    port = server.server_address[1]
    creds = Credentials(
        aws_access_key_id=ACCESS, aws_secret_access_key=SECRET, endpoint_url=f"http://127.0.0.1:{port}/gcs/"
    )
    store = GCSStore(BUCKET, creds, clock=lambda: NOW, sleep=sleeps.append)
    data = b"prefixed"
    assert store.put_bytes_create_once("k", data, sha256=hashlib.sha256(data).hexdigest())
    [req] = server.recorder.requests
    assert req["path"] == f"/gcs/{BUCKET}/k"
    assert _reverify(req)


@pytest.mark.parametrize("family", ["x-goog-meta-", "x-amz-meta-"])
def test_created_object_reads_back_with_sha256_through_interop_head(server, store, family):
    """HEAD goes through boto3 (S3 interop); the ``sha256`` set by ``x-goog-meta-sha256`` is seen
    whichever header family the endpoint uses to report it."""
    server.recorder.meta_family = family
    data = b'{"manifest": true}\n'
    digest = hashlib.sha256(data).hexdigest()
    assert store.put_bytes_create_once("runs/r1/m.json", data, sha256=digest)
    info = store.head("runs/r1/m.json")
    assert info is not None
    assert (info.key, info.size, info.sha256) == ("runs/r1/m.json", len(data), digest)
    assert info.checksum_sha256 is None
    assert store.head("runs/r1/absent.json") is None
    heads = [r for r in server.recorder.requests if r["method"] == "HEAD"]
    assert heads[0]["path"] == f"/{BUCKET}/runs/r1/m.json"
    h = _headers(heads[0])
    assert h["authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={ACCESS}/")
    assert "/auto/s3/aws4_request" in h["authorization"]
    assert "x-amz-checksum-mode" not in h
