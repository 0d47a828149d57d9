"""S3 specifics against real servers: server-verified checksums, error mapping without secrets, and the
non-enforcing endpoint (s3rver) that the probe must catch."""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import socket
import uuid
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from ckptflow.digest import FileDigest, sha256_bytes, sha256_file
from ckptflow.errors import CkptflowError, StoreError, UsageError, VerificationFailed
from ckptflow.store import Credentials, S3Store, load_credentials
from ckptflow.store.s3 import (
    LOCAL_DOWNLOADS,
    MAX_SINGLE_PART,
    REMOTE_DOWNLOADS,
    _full_object_sha256,
    downloads_for,
)
from ckptflow.store.s3_put import _check_composite
from helpers import servers

MiB = 1024 * 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.seaweedfs
def test_seaweedfs_rejects_a_wrong_checksum_sha256(seaweedfs_bucket, seaweedfs_credentials_path) -> None:
    client = servers.s3_client(seaweedfs_credentials_path)
    wrong = base64.b64encode(hashlib.sha256(b"other bytes").digest()).decode()
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=seaweedfs_bucket, Key="k", Body=b"these bytes", ChecksumSHA256=wrong)
    assert info.value.response["Error"]["Code"] == "BadDigest"
    assert S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path)).head("k") is None


@pytest.mark.seaweedfs
def test_a_refused_multipart_upload_is_aborted(seaweedfs_bucket, seaweedfs_credentials_path, tmp_path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(b"\1" * (11 * MiB))
    store = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path),
                    multipart_threshold=5 * MiB, part_size=5 * MiB)
    with pytest.raises(VerificationFailed, match="changed after it was hashed"):
        store.put_file("big.bin", src, digest=FileDigest(11 * MiB, sha256_bytes(b"stale")))
    uploads = servers.s3_client(seaweedfs_credentials_path).list_multipart_uploads(Bucket=seaweedfs_bucket)
    assert uploads.get("Uploads", []) == []


@pytest.mark.seaweedfs
def test_wrong_keys_give_a_store_error_naming_the_endpoint_and_no_secret(
    seaweedfs_bucket, seaweedfs_credentials_path, caplog
) -> None:
    good = load_credentials(seaweedfs_credentials_path)
    secret = "wrong-secret-that-must-not-leak"
    store = S3Store(seaweedfs_bucket, Credentials(good.aws_access_key_id, secret, good.endpoint_url, None))
    caplog.set_level(logging.DEBUG, logger="ckptflow")
    for call in (lambda: store.head("k"), lambda: store.list(""),
                 lambda: store.put_bytes_create_once("k", b"x", sha256=sha256_bytes(b"x"))):
        with pytest.raises(StoreError) as info:
            call()
        message = str(info.value)
        assert "127.0.0.1:18333" in message and "credentials" in message
        assert secret not in message and secret not in repr(info.value)
    assert secret not in caplog.text and secret not in repr(store)


def test_an_unreachable_endpoint_is_named_with_the_remedy() -> None:
    creds = Credentials("id", "closed-port-secret", f"http://127.0.0.1:{_free_port()}", "us-east-1")
    with pytest.raises(StoreError, match="cannot reach the endpoint") as info:
        S3Store("bucket", creds, max_attempts=1).head("k")
    assert "endpoint_url" in str(info.value) and "closed-port-secret" not in str(info.value)


@pytest.mark.s3rver
def test_s3rver_accepts_a_second_create_once_so_only_a_probe_can_catch_it(
    s3rver_bucket, s3rver_credentials_path
) -> None:
    """The non-enforcing endpoint really is non-enforcing: both writes "win" (FACTS)."""
    store = S3Store(s3rver_bucket, load_credentials(s3rver_credentials_path))
    key = f"probe/{uuid.uuid4().hex}.json"  # unique across processes: the workers and core legs share this bucket
    first, second = b"first", b"second"
    assert store.put_bytes_create_once(key, first, sha256=sha256_bytes(first)) is True
    assert store.put_bytes_create_once(key, second, sha256=sha256_bytes(second)) is True
    assert store.get_bytes(key) == second
    store.delete(key)


def test_head_reports_only_a_full_object_checksum() -> None:
    digest = hashlib.sha256(b"x").digest()
    b64 = base64.b64encode(digest).decode()
    assert _full_object_sha256(b64, "FULL_OBJECT") == digest.hex()
    assert _full_object_sha256(b64, None) == digest.hex()
    assert _full_object_sha256(f"{b64}-3", None) is None
    assert _full_object_sha256(b64, "COMPOSITE") is None
    assert _full_object_sha256("not base64!", None) is None


def test_parts_below_the_s3_minimum_are_refused(moto_s3) -> None:
    with pytest.raises(UsageError, match="5 MiB"):
        S3Store(moto_s3.bucket, moto_s3.credentials, part_size=MiB)


def test_create_once_refuses_a_sha256_that_does_not_match_the_bytes(moto_s3) -> None:
    store = S3Store(moto_s3.bucket, moto_s3.credentials)
    with pytest.raises(UsageError):
        store.put_bytes_create_once("k", b"bytes", sha256=sha256_bytes(b"other"))
    assert store.head("k") is None


def test_missing_objects_are_not_found_errors(moto_s3, tmp_path: Path) -> None:
    store = S3Store(moto_s3.bucket, moto_s3.credentials)
    with pytest.raises(CkptflowError, match=r"does not exist|no such object"):
        store.download_file("absent", tmp_path / "x")
    with pytest.raises(FileNotFoundError):
        store.get_bytes("absent")


@pytest.mark.seaweedfs
def test_a_small_file_changed_after_hashing_is_refused_before_it_is_sent(
        seaweedfs_bucket, seaweedfs_credentials_path, tmp_path) -> None:
    src = tmp_path / "small.bin"
    src.write_bytes(b"the bytes that were hashed")
    digest = FileDigest(src.stat().st_size, sha256_bytes(src.read_bytes()))
    src.write_bytes(b"the bytes that are there now")  # same size or not: the content decides
    store = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path), checksum_sha256=False)
    with pytest.raises(VerificationFailed, match="changed after it was hashed"):
        store.put_file("small.bin", src, digest=digest)
    assert store.head("small.bin") is None


def test_single_part_uploads_stay_small_enough_to_hold_and_check() -> None:
    with pytest.raises(UsageError, match="multipart_threshold"):
        S3Store("b", Credentials("k", "s", "http://127.0.0.1:1", None), multipart_threshold=MAX_SINGLE_PART + 1)
    assert S3Store("b", Credentials("k", "s", "http://127.0.0.1:1", None),
                   multipart_threshold=MAX_SINGLE_PART).multipart_threshold == MAX_SINGLE_PART


# ------------------------------------------------------------------ parts checked by the server


def _part_headers(store: S3Store) -> list[dict[str, str]]:
    """Records the headers of every UploadPart the store sends, on either of its clients."""
    seen: list[dict[str, str]] = []

    def record(request, **_):
        seen.append({k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()})

    for client in (store._client, store._unsigned()):
        client.meta.events.register("before-send.s3.UploadPart", record)
    return seen


def _small_parts_store(bucket: str, credentials_path: Path, **options) -> S3Store:
    return S3Store(bucket, load_credentials(credentials_path), multipart_threshold=5 * MiB, part_size=5 * MiB,
                   **options)


@pytest.mark.parametrize(("endpoint", "shape"), [
    ("http://127.0.0.1:18333", LOCAL_DOWNLOADS),
    ("http://localhost:9000", LOCAL_DOWNLOADS),
    ("http://[::1]:9000", LOCAL_DOWNLOADS),
    ("http://10.0.0.5:9000", REMOTE_DOWNLOADS),
    ("https://storage.example.org", REMOTE_DOWNLOADS),
    (None, REMOTE_DOWNLOADS),  # AWS's own endpoint
])
def test_downloads_are_cut_by_where_the_endpoint_is(endpoint, shape) -> None:
    assert downloads_for(endpoint) == shape
    store = S3Store("b", Credentials("k", "s", endpoint, None))
    assert (store.download_concurrency, store.download_range_size) == shape


def test_a_download_shape_given_is_kept_and_a_zero_one_is_refused() -> None:
    creds = Credentials("k", "s", "http://127.0.0.1:1", None)
    store = S3Store("b", creds, download_concurrency=8, download_range_size=8 * MiB)
    assert (store.download_concurrency, store.download_range_size) == (8, 8 * MiB)
    with pytest.raises(UsageError, match="download_concurrency"):
        S3Store("b", creds, download_concurrency=0)
    with pytest.raises(UsageError, match="download_range_size"):
        S3Store("b", creds, download_range_size=0)


@pytest.mark.seaweedfs
def test_parts_go_with_the_digests_taken_when_hashing_where_the_server_enforces_them(
        seaweedfs_bucket, seaweedfs_credentials_path, tmp_path) -> None:
    data = os.urandom(47 * MiB // 4)  # 11.75 MiB: 3 parts, the last one short
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    store = _small_parts_store(seaweedfs_bucket, seaweedfs_credentials_path)
    assert store.part_digest_size(len(data)) == 5 * MiB
    assert store.part_digest_size(4 * MiB) is None  # a single part: read whole and checked locally
    digest = sha256_file(src, part_size=store.part_digest_size(len(data)))
    assert store.part_checksums_enforced("big.bin") is True  # checked once, before the parts are recorded
    headers = _part_headers(store)
    info = store.put_file("big.bin", src, digest=digest)
    assert (info.size, info.sha256) == (len(data), digest.sha256)
    assert len(set(digest.parts)) == 3
    assert sorted(h["x-amz-checksum-sha256"] for h in headers) == sorted(base64.b64encode(p).decode()
                                                                        for p in digest.parts)
    # The signed checksum header binds each body, so the body is not hashed a second time for the signature.
    assert {h["x-amz-content-sha256"] for h in headers} == {"UNSIGNED-PAYLOAD"}
    client = servers.s3_client(seaweedfs_credentials_path)
    assert client.get_object(Bucket=seaweedfs_bucket, Key="big.bin")["Body"].read() == data
    assert client.list_multipart_uploads(Bucket=seaweedfs_bucket).get("Uploads", []) == []


@pytest.mark.seaweedfs
def test_a_file_changed_after_hashing_is_refused_by_the_server_part_by_part(
        seaweedfs_bucket, seaweedfs_credentials_path, tmp_path) -> None:
    src = tmp_path / "big.bin"
    src.write_bytes(b"\1" * (11 * MiB))
    store = _small_parts_store(seaweedfs_bucket, seaweedfs_credentials_path)
    digest = sha256_file(src, part_size=5 * MiB)
    with open(src, "r+b") as fh:  # same size, one byte of the second part differs
        fh.seek(7 * MiB)
        fh.write(b"\2")
    with pytest.raises(VerificationFailed, match="changed after it was hashed, or part 2") as info:
        store.put_file("big.bin", src, digest=digest)
    assert info.value.path == str(src)
    assert store.head("big.bin") is None
    uploads = servers.s3_client(seaweedfs_credentials_path).list_multipart_uploads(Bucket=seaweedfs_bucket)
    assert uploads.get("Uploads", []) == []


@pytest.mark.seaweedfs
def test_without_usable_part_digests_the_sent_bytes_are_hashed_here(
        seaweedfs_bucket, seaweedfs_credentials_path, tmp_path) -> None:
    """No part digests, part digests of another part size, or part checksums switched off: parts go
    signed and without a checksum, and a change after hashing is caught by the in-order hash."""
    src = tmp_path / "big.bin"
    src.write_bytes(b"\1" * (11 * MiB))
    whole = sha256_file(src)
    cases = [(_small_parts_store(seaweedfs_bucket, seaweedfs_credentials_path), whole),
             (_small_parts_store(seaweedfs_bucket, seaweedfs_credentials_path), sha256_file(src, part_size=6 * MiB)),
             (_small_parts_store(seaweedfs_bucket, seaweedfs_credentials_path, part_checksums=False),
              sha256_file(src, part_size=5 * MiB))]
    assert cases[2][0].part_digest_size(11 * MiB) is None
    for n, (store, digest) in enumerate(cases):
        headers = _part_headers(store)
        store.put_file(f"ok-{n}", src, digest=digest)
        assert len(headers) == 3
        assert all("x-amz-checksum-sha256" not in h and h["x-amz-content-sha256"] != "UNSIGNED-PAYLOAD"
                   for h in headers)
    with open(src, "r+b") as fh:
        fh.seek(7 * MiB)
        fh.write(b"\2")
    with pytest.raises(VerificationFailed, match=r"changed after it was hashed \(its bytes now hash"):
        cases[0][0].put_file("changed", src, digest=whole)
    assert cases[0][0].head("changed") is None


@pytest.mark.s3rver
def test_part_checksums_are_not_trusted_where_the_endpoint_does_not_enforce_them(
        s3rver_bucket, s3rver_credentials_path, moto_s3) -> None:
    """s3rver stores a part under a wrong checksum, moto too: both get the in-order hash instead."""
    for store in (S3Store(s3rver_bucket, load_credentials(s3rver_credentials_path)),
                  S3Store(moto_s3.bucket, moto_s3.credentials)):
        key = f"part-check/{uuid.uuid4().hex}"
        assert store.part_checksums_enforced(key) is False
        assert store.head(key) is None


@pytest.mark.seaweedfs
def test_the_part_checksum_check_leaves_nothing_behind(seaweedfs_bucket, seaweedfs_credentials_path) -> None:
    store = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path))
    assert store.part_checksums_enforced("k") is True
    assert store.part_checksums_enforced("other") is True  # once per store
    client = servers.s3_client(seaweedfs_credentials_path)
    assert client.list_multipart_uploads(Bucket=seaweedfs_bucket).get("Uploads", []) == []
    assert store.list("") == []


def test_a_completed_upload_must_carry_the_composite_of_the_parts_sent() -> None:
    parts = (hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest())
    composite = base64.b64encode(hashlib.sha256(b"".join(parts)).digest()).decode()
    _check_composite(None, parts, "s3://b/k")  # endpoints that return none
    _check_composite(f"{composite}-2", parts, "s3://b/k")
    _check_composite(composite, parts, "s3://b/k")
    with pytest.raises(VerificationFailed, match="not that of the parts sent"):
        _check_composite(f"{composite}-2", parts[::-1], "s3://b/k")


@pytest.mark.seaweedfs
def test_an_upload_completed_from_other_parts_is_deleted_not_left_under_the_digest(
        seaweedfs_bucket, seaweedfs_credentials_path, tmp_path) -> None:
    """An endpoint whose completed object does not carry the composite of the parts sent (here its
    answer is altered on the way back) leaves nothing behind that HEAD would take for the file."""
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(11 * MiB))
    store = _small_parts_store(seaweedfs_bucket, seaweedfs_credentials_path)
    digest = sha256_file(src, part_size=5 * MiB)

    def other_parts(parsed, **_):
        parsed["ChecksumSHA256"] = base64.b64encode(hashlib.sha256(b"other parts").digest()).decode() + "-3"

    store._client.meta.events.register("after-call.s3.CompleteMultipartUpload", other_parts)
    with pytest.raises(VerificationFailed, match="not that of the parts sent"):
        store.put_file("big.bin", src, digest=digest)
    assert store.head("big.bin") is None


class _CuttingServer:
    """A real HTTP server on loopback that answers ranged GETs of one blob; the first ``cut`` answers
    announce the whole range but send half of it and close the connection (a body that breaks off)."""

    def __init__(self, blob: bytes, cut: int):
        import http.server
        import threading

        outer = self
        self.blob, self.cut, self.gets = blob, cut, 0

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # the http.server API
                first, last = self.headers["Range"].removeprefix("bytes=").split("-")
                body = outer.blob[int(first):int(last) + 1]
                outer.gets += 1
                self.send_response(206)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if outer.gets <= outer.cut:
                    self.wfile.write(body[:len(body) // 2])
                    self.close_connection = True
                    return
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def store(self) -> S3Store:
        creds = Credentials("k", "s", f"http://127.0.0.1:{self.server.server_address[1]}", "us-east-1")
        return S3Store("b", creds, concurrency=1, download_concurrency=1, max_attempts=1)


def test_a_body_that_breaks_off_is_fetched_again_and_the_bytes_are_whole(tmp_path: Path) -> None:
    blob = os.urandom(3 * 1024 * 1024 + 11)
    with _CuttingServer(blob, cut=1) as server:
        got = server.store().download_file("k", tmp_path / "out", size=len(blob))
    assert (tmp_path / "out").read_bytes() == blob and got.sha256 == hashlib.sha256(blob).hexdigest()
    assert server.gets == 2  # the broken range once more, nothing else


def test_a_body_that_keeps_breaking_off_fails_naming_the_object(tmp_path: Path) -> None:
    blob = os.urandom(100_000)
    with _CuttingServer(blob, cut=100) as server, pytest.raises(StoreError, match=r"GET s3://b/k at 127\.0\.0\.1:\d+: body broke off"):
        server.store().download_file("k", tmp_path / "out", size=len(blob))
    assert server.gets == 4  # four attempts in all


def test_a_plain_body_is_read_straight_from_its_socket_and_the_connection_is_reused(tmp_path: Path) -> None:
    blob = os.urandom(64 * 1024)
    with _CuttingServer(blob, cut=0) as server:
        store = server.store()
        for offset in (0, 1000):
            with store.open_range("k", offset, 5000) as reader:
                assert reader._plain is not None  # no urllib3 copy in between
                buf = bytearray(5000)
                assert reader.readinto(memoryview(buf)) == 5000 and bytes(buf) == blob[offset:offset + 5000]
        pools = store._client._endpoint.http_session._manager.pools
        [pool] = [pools[key] for key in pools.keys()]
        assert pool.num_connections == 1  # the second GET reused the first one's connection


def test_a_bucket_the_caller_may_not_list_is_taken_as_existing_and_a_missing_one_is_refused(moto_s3) -> None:
    """HeadBucket answers 403 for an existing bucket to credentials allowed to write under a prefix but not
    to list the bucket (a common IAM shape): that is no reason to refuse; 404 is."""
    from botocore.stub import Stubber

    from ckptflow.errors import NotFound

    store = S3Store(moto_s3.bucket, moto_s3.credentials)
    with Stubber(store._client) as stub:
        stub.add_client_error("head_bucket", service_error_code="403", http_status_code=403)
        store.require_bucket()
        stub.add_client_error("head_bucket", service_error_code="404", http_status_code=404)
        with pytest.raises(NotFound, match=f"bucket '{moto_s3.bucket}' does not exist"):
            store.require_bucket()
        stub.add_client_error("head_bucket", service_error_code="InternalError", http_status_code=500)
        with pytest.raises(StoreError):
            store.require_bucket()
        stub.assert_no_pending_responses()
