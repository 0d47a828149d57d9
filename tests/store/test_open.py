"""store.open: --bucket / --credentials / environment / recorded destination → one opened store."""

from __future__ import annotations

import pytest

from ckptflow.errors import InvalidRecord, NotFound, Refused, UsageError
from ckptflow.records.receipt import ReceiptDestination
from ckptflow.store import LocalStore, S3Store
from ckptflow.store.credentials import ENV_VAR
from ckptflow.store.open import (
    BUCKET_ENV,
    check_destination,
    credentials_for,
    load_credentials_arg,
    open_bucket_arg,
    open_uri,
    store_factory,
)
from ckptflow.store.uri import StoreURI, parse_store_uri


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.delenv(BUCKET_ENV, raising=False)
    return monkeypatch


def _write_credentials(path, **extra):
    body = {"aws_access_key_id": "id", "aws_secret_access_key": "secret", **extra}
    path.write_text("{" + ", ".join(f'"{k}": "{v}"' for k, v in body.items()) + "}")
    return path


def test_credentials_come_from_the_flag_then_the_environment(tmp_path, no_env) -> None:
    assert load_credentials_arg(None) is None
    env = _write_credentials(tmp_path / "env.json", endpoint_url="http://127.0.0.1:1")
    flag = _write_credentials(tmp_path / "flag.json", endpoint_url="http://127.0.0.1:2")
    no_env.setenv(ENV_VAR, str(env))
    assert load_credentials_arg(None).endpoint_url == "http://127.0.0.1:1"
    assert load_credentials_arg(str(flag)).endpoint_url == "http://127.0.0.1:2"
    with pytest.raises(NotFound, match=r"missing\.json"):
        load_credentials_arg(str(tmp_path / "missing.json"))


def test_file_uris_never_read_credentials(tmp_path, no_env) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("not json")
    no_env.setenv(ENV_VAR, str(broken))
    assert credentials_for(f"file://{tmp_path}", None) is None
    assert credentials_for(StoreURI("file", str(tmp_path), ""), str(tmp_path / "missing.json")) is None
    with pytest.raises(InvalidRecord, match=r"broken\.json"):
        credentials_for("s3://bucket/p", None)
    store = open_bucket_arg(f"file://{tmp_path}", str(tmp_path / "missing.json"))
    assert isinstance(store, LocalStore) and store.root == tmp_path
    local = store_factory(str(tmp_path / "missing.json"))(store.destination)
    assert local.destination == store.destination


def test_bucket_argument_then_environment_and_refusals(tmp_path, moto_s3, no_env) -> None:
    with pytest.raises(UsageError, match=BUCKET_ENV):
        open_bucket_arg(None, None)
    no_env.setenv(BUCKET_ENV, f"file://{tmp_path}")
    assert isinstance(open_bucket_arg(None, None), LocalStore)
    creds = _write_credentials(tmp_path / "c.json", region_name="us-east-1")
    named = open_bucket_arg(moto_s3.bucket, str(creds))
    assert isinstance(named, S3Store) and named.destination.bucket == moto_s3.bucket
    with pytest.raises(UsageError, match="names a key inside the bucket"):
        open_bucket_arg(f"s3://{moto_s3.bucket}/some/key", str(creds))
    with pytest.raises(InvalidRecord, match="--bucket"):
        open_bucket_arg("ftp://bucket", str(creds))


def test_open_uri_reuses_a_store_only_when_it_holds_the_uri(tmp_path) -> None:
    root = LocalStore(tmp_path)
    assert open_uri(parse_store_uri(f"file://{tmp_path}/run/iter_5"), root)[1] == "run/iter_5"
    assert open_uri(parse_store_uri(f"file://{tmp_path}"), root)[1] == ""
    opened, prefix = open_uri(parse_store_uri(f"file://{tmp_path}/run/iter_5"))
    assert (opened.root, prefix) == (tmp_path / "run/iter_5", "")
    with pytest.raises(UsageError, match="does not hold"):
        open_uri(parse_store_uri(f"file://{tmp_path.parent}/elsewhere"), root)
    with pytest.raises(UsageError, match="does not hold"):
        open_uri(parse_store_uri("s3://bucket/run/iter_5"), root)


def test_check_destination_names_the_record_and_both_endpoints(tmp_path) -> None:
    store = LocalStore(tmp_path)
    same = ReceiptDestination.at(store.destination, "run/iter_5")
    check_destination(store, same, what="the receipt")
    other = ReceiptDestination("file", str(tmp_path / "other"), "", "run/iter_5")
    with pytest.raises(Refused, match=r"receipt X is bound to .*other.*but the credentials reach"):
        check_destination(store, other, what="receipt X")


def test_one_artifact_uri_parser_for_fetch_and_materialize() -> None:
    from ckptflow.archive.keys import parse_artifact_uri

    s3 = parse_artifact_uri("s3://bucket/p/checkpoint_artifacts/iter_000300")
    assert (s3.uri.scheme, s3.uri.bucket, s3.prefix, s3.name, s3.iteration) == (
        "s3", "bucket", "p/checkpoint_artifacts/iter_000300", "iter_000300", 300)
    local = parse_artifact_uri("file:///archive/p/iter_5")
    assert (local.uri.bucket, local.prefix, local.iteration) == ("/archive/p/iter_5", "", 5)
    with pytest.raises(UsageError, match=r"--artifact-uri s3://bucket/p does not end in iter_<N>"):
        parse_artifact_uri("s3://bucket/p", what="--artifact-uri")
    with pytest.raises(UsageError, match="artifact URI 'ftp://x' has the unsupported scheme"):
        parse_artifact_uri("ftp://x")
