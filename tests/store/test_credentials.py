"""Credentials files: strict parsing, and secrets that never leave the object holding them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptflow.errors import InvalidRecord, NotFound
from ckptflow.store import Credentials, endpoint_authority, load_credentials, resolve_credentials_path

KEY_ID = "AKIDEXAMPLEKEYID0001"
SECRET = "s3cr3t/VALUE+never-shown"
GOOD = {"aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET,
        "endpoint_url": "http://127.0.0.1:18333", "region_name": "us-east-1"}


def write(tmp_path: Path, obj: object, name: str = "creds.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def assert_no_secret(text: str) -> None:
    assert SECRET not in text and KEY_ID not in text


def test_a_valid_file_loads_every_field(tmp_path: Path) -> None:
    creds = load_credentials(write(tmp_path, GOOD))
    assert creds == Credentials(KEY_ID, SECRET, "http://127.0.0.1:18333", "us-east-1")


def test_endpoint_and_region_may_be_null_or_absent(tmp_path: Path) -> None:
    absent = load_credentials(write(tmp_path, {"aws_access_key_id": KEY_ID, "aws_secret_access_key": SECRET}))
    null = load_credentials(write(tmp_path, {**GOOD, "endpoint_url": None, "region_name": None}, "b.json"))
    assert absent == null == Credentials(KEY_ID, SECRET)


def test_repr_and_str_redact_both_keys() -> None:
    creds = Credentials(KEY_ID, SECRET, "https://s3.example.org", "eu-west-1")
    for text in (repr(creds), str(creds), f"{creds}", repr([creds])):
        assert_no_secret(text)
        assert "<redacted>" in text and "s3.example.org" in text


@pytest.mark.parametrize(
    ("content", "names"),
    [
        ({"aws_access_key_id": KEY_ID}, "aws_secret_access_key"),
        ({**GOOD, "extra_field": SECRET}, "extra_field"),
        ({**GOOD, "aws_secret_access_key": 12345}, "aws_secret_access_key"),
        ({**GOOD, "aws_access_key_id": ""}, "aws_access_key_id"),
        ({**GOOD, "region_name": ["eu-west-1"]}, "region_name"),
        ({**GOOD, "endpoint_url": f"https://{KEY_ID}:{SECRET}@s3.example.org"}, "endpoint_url"),
        ({**GOOD, "endpoint_url": f"https://s3.example.org/?token={SECRET}"}, "endpoint_url"),
        ({**GOOD, "endpoint_url": f"ftp://{SECRET}"}, "endpoint_url"),
    ],
    ids=["missing", "extra", "non-string", "empty", "list", "userinfo", "query", "scheme"],
)
def test_malformed_files_are_refused_by_field_without_echoing_values(tmp_path: Path, content, names) -> None:
    path = write(tmp_path, content)
    with pytest.raises(InvalidRecord) as info:
        load_credentials(path)
    message = str(info.value)
    assert str(path) in message and names in message
    assert_no_secret(message)
    assert_no_secret(repr(info.value))


@pytest.mark.parametrize("raw", [b"[1, 2]", b'{"aws_access_key_id": "x",', b"\xef\xbb\xbf{}",
                                 b'{"aws_access_key_id": "x", "aws_access_key_id": "y"}'])
def test_non_json_objects_are_refused_naming_the_file(tmp_path: Path, raw: bytes) -> None:
    path = tmp_path / "creds.json"
    path.write_bytes(raw.replace(b'"x"', json.dumps(SECRET).encode()))
    with pytest.raises(InvalidRecord) as info:
        load_credentials(path)
    assert str(path) in str(info.value)
    assert_no_secret(str(info.value))


def test_a_missing_file_names_the_file_and_the_remedy(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match="CKPTFLOW_CREDENTIALS"):
        load_credentials(tmp_path / "nope.json")


def test_constructing_credentials_by_hand_is_validated_too() -> None:
    with pytest.raises(InvalidRecord) as info:
        Credentials(KEY_ID, SECRET, f"https://user:{SECRET}@host")
    assert_no_secret(str(info.value))


@pytest.mark.parametrize(
    ("endpoint", "region", "authority"),
    [
        ("http://127.0.0.1:18333", None, "127.0.0.1:18333"),
        ("https://S3.Example.ORG/some/path", None, "s3.example.org"),
        ("https://[::1]:9000", None, "[::1]:9000"),
        (None, "eu-west-1", "s3.eu-west-1.amazonaws.com"),
        (None, None, "s3.amazonaws.com"),
    ],
)
def test_endpoint_authority_is_host_and_port_only(endpoint, region, authority) -> None:
    assert endpoint_authority(Credentials(KEY_ID, SECRET, endpoint, region)) == authority


def test_credentials_path_comes_from_the_argument_then_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.delenv("CKPTFLOW_CREDENTIALS", raising=False)
    assert resolve_credentials_path(None) is None
    monkeypatch.setenv("CKPTFLOW_CREDENTIALS", str(tmp_path / "env.json"))
    assert resolve_credentials_path(None) == tmp_path / "env.json"
    assert resolve_credentials_path(tmp_path / "arg.json") == tmp_path / "arg.json"
    assert resolve_credentials_path("") == tmp_path / "env.json"
