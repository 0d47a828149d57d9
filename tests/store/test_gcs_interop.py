"""GCSStore's S3-interoperability half (reads, HEAD, lists, deletes, file puts) on moto's in-process S3.

moto stands in for ``storage.googleapis.com`` (``MOTO_S3_CUSTOM_ENDPOINTS``), so this checks that the
composition reaches a real ``S3Store`` configured for GCS: scheme ``gs``, region ``auto``, no
``x-amz-checksum-sha256`` (the interop API does not verify it), path-style requests to the GCS host.
The create-once half is checked in ``test_gcs_request_shape.py``.
"""

from __future__ import annotations

import hashlib

import pytest

from ckptflow.digest import sha256_file
from ckptflow.store.base import ObjectStore
from ckptflow.store.credentials import Credentials
from ckptflow.store.gcs import DEFAULT_GCS_ENDPOINT, GCSStore
from helpers import servers
from helpers.moto_bodies import mock_aws_bytes_bodies

BUCKET = "gcs-interop-bucket"
SECRET = "interop/secret+not-shown"


@pytest.fixture
def store(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MOTO_S3_CUSTOM_ENDPOINTS", DEFAULT_GCS_ENDPOINT)
    with mock_aws_bytes_bodies():
        creds = Credentials(aws_access_key_id="GOOG1INTEROP", aws_secret_access_key=SECRET)
        s = GCSStore(BUCKET, creds, multipart_threshold=6 * 1024 * 1024, part_size=5 * 1024 * 1024)
        servers.create_bucket(Credentials(creds.aws_access_key_id, SECRET, DEFAULT_GCS_ENDPOINT, "auto"), BUCKET)
        yield s


def _sent_headers(store):
    """Collect the headers of every request the interop client sends."""
    seen: list[dict[str, str]] = []

    def record(request, **_):
        seen.append(
            {k.lower(): (v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()}
        )
        seen[-1][":url"] = request.url

    store._s3._client.meta.events.register("before-send.s3", record)
    return seen


def test_interop_part_is_configured_for_gcs(store):
    assert isinstance(store, ObjectStore)
    s3 = store._s3
    assert s3.scheme == "gs"
    assert s3.supports_checksum_sha256 is False
    assert store.supports_checksum_sha256 is False
    assert s3.destination == store.destination
    assert store.destination.as_dict() == {
        "scheme": "gs",
        "endpoint": "storage.googleapis.com",
        "bucket": BUCKET,
    }
    assert s3._client.meta.region_name == "auto"
    assert SECRET not in repr(store) and SECRET not in repr(s3)


def test_put_file_head_list_get_download_delete(store, tmp_path):
    sent = _sent_headers(store)
    small = tmp_path / "small.bin"
    small.write_bytes(b"small payload\n" * 100)
    big = tmp_path / "big.bin"
    big.write_bytes(bytes(range(256)) * (7 * 1024 * 1024 // 256))  # multipart above 6 MiB
    for path, key in ((small, "runs/r1/iter_1/small.bin"), (big, "runs/r1/iter_1/big.bin")):
        digest = sha256_file(path)
        info = store.put_file(key, path, digest=digest)
        assert (info.size, info.sha256) == (digest.size, digest.sha256)
        head = store.head(key)
        assert head is not None and (head.size, head.sha256) == (digest.size, digest.sha256)

    assert [o.key for o in store.list("runs/r1/")] == ["runs/r1/iter_1/big.bin", "runs/r1/iter_1/small.bin"]
    assert store.get_bytes("runs/r1/iter_1/small.bin") == small.read_bytes()

    dest = tmp_path / "back.bin"
    got = store.download_file("runs/r1/iter_1/big.bin", dest)
    assert got.sha256 == hashlib.sha256(big.read_bytes()).hexdigest()
    assert dest.read_bytes() == big.read_bytes()

    store.delete("runs/r1/iter_1/small.bin")
    store.delete("runs/r1/iter_1/small.bin")  # absent is not an error
    assert store.head("runs/r1/iter_1/small.bin") is None

    assert sent, "no request was observed"
    for headers in sent:
        assert headers[":url"].startswith(f"{DEFAULT_GCS_ENDPOINT}/{BUCKET}")
        assert not [
            n for n in headers if n.startswith("x-amz-checksum") or n.startswith("x-amz-sdk-checksum")
        ]
        assert not [n for n in headers if n.startswith("x-goog-")]
        assert "/auto/s3/aws4_request" in headers["authorization"]
        assert SECRET not in "".join(headers.values())
