"""Store URIs: what parses, what is refused by name, and the file:// convention."""

from __future__ import annotations

import pytest

from ckptflow.errors import InvalidRecord, Refused, UnsafePath
from ckptflow.store import (
    Credentials,
    LocalStore,
    S3Store,
    StoreURI,
    open_destination,
    open_store,
    parse_store_uri,
)


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("s3://bucket/a/b", StoreURI("s3", "bucket", "a/b")),
        ("s3://bucket/a/b/", StoreURI("s3", "bucket", "a/b")),
        ("s3://bucket", StoreURI("s3", "bucket", "")),
        ("s3://bucket/", StoreURI("s3", "bucket", "")),
        ("gs://my_bucket.example/ckpt/iter_5", StoreURI("gs", "my_bucket.example", "ckpt/iter_5")),
        ("s3://b-1/run/checkpoint_artifacts/iter_300", StoreURI("s3", "b-1", "run/checkpoint_artifacts/iter_300")),
        ("file:///lustre/archive/run1", StoreURI("file", "/lustre/archive/run1", "")),
        ("file:///lustre/archive/run1/", StoreURI("file", "/lustre/archive/run1", "")),
        ("file://localhost/srv/archive", StoreURI("file", "/srv/archive", "")),
    ],
)
def test_valid_uris_parse_to_scheme_bucket_and_key(uri: str, expected: StoreURI) -> None:
    assert parse_store_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("http://bucket/key", "unsupported scheme"),
        ("s3:/bucket/key", "not a URI"),
        ("bucket/key", "not a URI"),
        ("s3:///key", "empty bucket"),
        ("gs://", "empty bucket"),
        ("s3://Bad Bucket!/k", "invalid bucket"),
        ("s3://bkt/../etc/passwd", r"'\.\.'"),
        ("s3://bucket/a/../../b", r"'\.\.'"),
        ("s3://bucket/a//b", "empty"),
        ("s3://bucket//abs", "absolute"),
        ("s3://bucket/a\\b", "backslash"),
        ("file://relative/path", "absolute path"),
        ("file://otherhost/srv/x", "absolute path"),
        ("file:///", "file-system root"),
        ("file:///srv/../etc", r"'\.\.'"),
    ],
)
def test_invalid_uris_are_refused_by_name(uri: str, problem: str) -> None:
    with pytest.raises(InvalidRecord, match=problem):
        parse_store_uri(uri)


def test_unsafe_keys_are_an_unsafe_path_error() -> None:
    with pytest.raises(UnsafePath):
        parse_store_uri("s3://bucket/a/../b")


def test_user_information_in_a_uri_is_refused_without_being_echoed() -> None:
    with pytest.raises(InvalidRecord) as info:
        parse_store_uri("s3://AKID:topsecret@bucket/key")
    assert "topsecret" not in str(info.value) and "AKID" not in str(info.value)


def test_schemes_can_be_restricted() -> None:
    with pytest.raises(InvalidRecord, match="unsupported scheme 'file'"):
        parse_store_uri("file:///srv/x", schemes=("s3",))


def test_uri_strings_round_trip_and_children_are_validated() -> None:
    uri = parse_store_uri("s3://bucket/run")
    assert str(uri.child("iter_5/model.pt")) == "s3://bucket/run/iter_5/model.pt"
    assert parse_store_uri(str(uri)) == uri
    assert str(parse_store_uri("file:///srv/archive").child("p/x")) == "file:///srv/archive/p/x"
    with pytest.raises(UnsafePath):
        uri.child("../escape")


def test_open_store_picks_the_backend_from_the_scheme(tmp_path, moto_s3) -> None:
    local = open_store(f"file://{tmp_path}")
    assert isinstance(local, LocalStore) and local.root == tmp_path
    assert local.destination.as_dict() == {"scheme": "file", "endpoint": str(tmp_path), "bucket": ""}
    s3 = open_store(f"s3://{moto_s3.bucket}/some/prefix", moto_s3.credentials)
    assert isinstance(s3, S3Store)
    assert s3.destination.as_dict() == {"scheme": "s3", "endpoint": "s3.us-east-1.amazonaws.com",
                                        "bucket": moto_s3.bucket}
    assert isinstance(open_store("s3", moto_s3.credentials, bucket=moto_s3.bucket), S3Store)


def test_a_recorded_destination_reopens_only_with_credentials_for_that_endpoint(tmp_path, moto_s3) -> None:
    store = open_store(f"s3://{moto_s3.bucket}", moto_s3.credentials)
    assert open_destination(store.destination, moto_s3.credentials).destination == store.destination
    elsewhere = Credentials("id", "secret-elsewhere", "http://127.0.0.1:9", "us-east-1")
    with pytest.raises(Refused, match=r"127\.0\.0\.1:9"):
        open_destination(store.destination, elsewhere)
    local = open_store(f"file://{tmp_path}")
    assert open_destination(local.destination).destination == local.destination
