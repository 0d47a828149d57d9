"""The S3 store's small reads (``small_gets``) against a real SeaweedFS: the signed fast path returns the
bytes ``get_bytes`` returns, and every answer it does not take (a missing key, a refusal) gives exactly
the error of the normal path."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from urllib.parse import quote

import pytest

from ckptflow.digest import sha256_bytes
from ckptflow.errors import NotFound, Refused, StoreError
from ckptflow.store import Credentials, S3Store, load_credentials

KEYS = [f"records/{i:03d}/.posttrain-archive.json" for i in range(40)] + [
    "odd/with space.json", "odd/plus+sign.json", "odd/percent%25and%.json", "odd/ünï cødé/日本.json",
    "odd/tilde~and=eq&amp;.json", "odd/semi;colon,comma'quote(paren).json", "odd/trailing.", "odd/empty",
]


def _data(key: str) -> bytes:
    return b"" if key.endswith("empty") else f'{{"key": "{key}"}}\n'.encode() * (1 + len(key) % 7)


def _populated(bucket: str, credentials_path) -> S3Store:
    store = S3Store(bucket, load_credentials(credentials_path))
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: store.put_bytes_create_once(k, _data(k), sha256=sha256_bytes(_data(k))), KEYS))
    return store


@pytest.mark.seaweedfs
def test_small_gets_return_the_bytes_of_get_bytes_through_the_fast_path(seaweedfs_bucket,
                                                                        seaweedfs_credentials_path) -> None:
    store = _populated(seaweedfs_bucket, seaweedfs_credentials_path)
    reader = store.small_gets
    with ThreadPoolExecutor(store.concurrency) as pool:
        got = dict(zip(KEYS, pool.map(lambda k: reader.get_bytes(k, max_bytes=1024), KEYS), strict=True))
    assert got == {k: store.get_bytes(k) for k in KEYS} == {k: _data(k) for k in KEYS}
    assert (reader.fast, reader.fallbacks) == (len(KEYS), 0)


@pytest.mark.seaweedfs
def test_a_missing_key_falls_back_to_the_normal_not_found(seaweedfs_bucket, seaweedfs_credentials_path) -> None:
    store = _populated(seaweedfs_bucket, seaweedfs_credentials_path)
    with pytest.raises(NotFound) as normal:
        store.get_bytes("records/absent.json")
    with pytest.raises(NotFound) as small:
        store.small_gets.get_bytes("records/absent.json")
    assert str(small.value) == str(normal.value)
    assert (store.small_gets.fast, store.small_gets.fallbacks) == (0, 1)


@pytest.mark.seaweedfs
def test_an_object_over_the_limit_falls_back_to_the_normal_refusal(seaweedfs_bucket,
                                                                   seaweedfs_credentials_path) -> None:
    store = _populated(seaweedfs_bucket, seaweedfs_credentials_path)
    key = KEYS[0]
    with pytest.raises(Refused) as normal:
        store.get_bytes(key, max_bytes=4)
    with pytest.raises(Refused) as small:
        store.small_gets.get_bytes(key, max_bytes=4)
    assert str(small.value) == str(normal.value)
    assert store.small_gets.fallbacks == 1


@pytest.mark.seaweedfs
def test_wrong_credentials_fall_back_to_the_normal_error(seaweedfs_bucket, seaweedfs_credentials_path) -> None:
    _populated(seaweedfs_bucket, seaweedfs_credentials_path)
    good = load_credentials(seaweedfs_credentials_path)
    secret = "wrong-secret-for-small-gets"
    store = S3Store(seaweedfs_bucket, Credentials(good.aws_access_key_id, secret, good.endpoint_url, None),
                    max_attempts=1)
    with pytest.raises(StoreError) as normal:
        store.get_bytes(KEYS[0])
    with pytest.raises(StoreError) as small:
        store.small_gets.get_bytes(KEYS[0])
    assert type(small.value) is type(normal.value) and str(small.value) == str(normal.value)
    assert secret not in str(small.value)
    assert (store.small_gets.fast, store.small_gets.fallbacks) == (0, 1)


@pytest.mark.parametrize("token", [None, "session  token/with+odd=chars"])
@pytest.mark.parametrize("endpoint", ["http://127.0.0.1:18333", "https://s3.example.org", "https://[::1]:9000"])
def test_the_cached_signer_gives_botocores_authorization_header(monkeypatch, endpoint, token) -> None:
    from datetime import datetime, timezone

    import botocore.auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials as BotoCredentials

    store = S3Store("bucket-x", Credentials("AKIDEXAMPLE", "secret/with+chars", endpoint, "eu-west-3"))
    reader = store.small_gets
    reader._prepare()
    assert reader._signer is not None
    meta = store._client.meta
    boto = BotoCredentials("AKIDEXAMPLE", "secret/with+chars", token).get_frozen_credentials()
    base = f"{store._client.meta.endpoint_url}{reader._path}"
    for when in (datetime(2026, 1, 1, 23, 59, 59, tzinfo=timezone.utc), datetime(2026, 1, 2, 0, 0, 1,
                                                                                 tzinfo=timezone.utc)):
        monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda when=when: when)
        for key in KEYS:
            path = f"{reader._path}/{quote(key, safe='/~')}"
            request = AWSRequest(method="GET", url=base + path[len(reader._path):], headers={"User-Agent": "ua"})
            botocore.auth.S3SigV4Auth(boto, meta.service_model.signing_name, meta.region_name).add_auth(request)
            ours = reader._signer.headers(path, boto, when.strftime("%Y%m%dT%H%M%SZ"))
            expected = {k: v for k, v in request.headers.items() if k != "User-Agent"}
            assert {k: v for k, v in ours.items() if k != "Host"} == expected
            assert ours["Host"] == botocore.auth._host_from_url(request.url)
