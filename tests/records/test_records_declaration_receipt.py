"""Declaration and receipt: digest binding, secrets never stored, legacy markers never trusted."""

from __future__ import annotations

import hashlib

import pytest
from records_samples import hexd, make_declaration, make_receipt

from ckptflow.errors import InvalidRecord
from ckptflow.jsonio import encode_json
from ckptflow.records import LegacyRecord
from ckptflow.records.declaration import declaration_digest, encode_declaration, parse_declaration
from ckptflow.records.manifest import FILENAME as MANIFEST_FILENAME
from ckptflow.records.receipt import (
    FILENAME,
    Receipt,
    ReceiptDestination,
    is_legacy_receipt,
    parse_receipt,
    read_receipt,
    write_receipt,
)


def test_declaration_digest_is_the_sha256_of_its_encoded_bytes():
    record = make_declaration(0)
    assert declaration_digest(record) == hashlib.sha256(encode_declaration(record)).hexdigest()
    assert declaration_digest(record) != declaration_digest(make_declaration(1))


def test_declaration_must_list_the_manifest():
    data = make_declaration(0).to_dict()
    data["files"] = [f for f in data["files"] if f["path"] != MANIFEST_FILENAME]
    with pytest.raises(InvalidRecord, match=r"does not list the manifest"):
        parse_declaration(encode_json(data))


def test_declaration_manifest_digest_must_match_its_listing():
    data = make_declaration(0).to_dict()
    data["manifest_sha256"] = hexd("f")
    with pytest.raises(
        InvalidRecord, match=r"lists \.posttrain-checkpoint-artifact\.json with sha256 0+ but"
    ):
        parse_declaration(encode_json(data))


SECRET_ENDPOINTS = [
    "user:hunter2@s3.example.org",
    "s3.example.org?X-Amz-Signature=hunter2",
    "host#hunter2",
    "a hunter2",
]


@pytest.mark.parametrize("endpoint", SECRET_ENDPOINTS, ids=["userinfo", "query", "fragment", "space"])
def test_receipt_with_secret_like_endpoint_is_refused_without_echoing_it(tmp_path, endpoint):
    data = make_receipt(0).to_dict()
    data["destination"]["endpoint"] = endpoint
    (tmp_path / FILENAME).write_bytes(encode_json(data))
    with pytest.raises(InvalidRecord) as info:
        read_receipt(tmp_path)
    assert "destination.endpoint" in str(info.value) and FILENAME in str(info.value)
    assert "hunter2" not in str(info.value)


@pytest.mark.parametrize("endpoint", SECRET_ENDPOINTS, ids=["userinfo", "query", "fragment", "space"])
def test_receipt_with_secret_like_endpoint_is_never_written(tmp_path, endpoint):
    good = make_receipt(0)
    dest = good.destination
    bad = Receipt(
        ReceiptDestination(dest.scheme, endpoint, dest.bucket, dest.prefix),
        good.declaration_sha256,
        good.files,
        good.uploaded_at,
    )
    with pytest.raises(InvalidRecord) as info:
        write_receipt(tmp_path, bad)
    assert "hunter2" not in str(info.value)
    assert not (tmp_path / FILENAME).exists()


@pytest.mark.parametrize("endpoint", ["s3.example.org", "127.0.0.1:18333", "[::1]:9000", "/srv/archive", ""])
def test_receipt_accepts_plain_authorities_and_archive_roots(tmp_path, endpoint):
    record = make_receipt(0)
    record = Receipt(
        ReceiptDestination("file" if endpoint.startswith("/") else "s3", endpoint, "b", "p"),
        record.declaration_sha256,
        record.files,
        record.uploaded_at,
    )
    write_receipt(tmp_path, record)
    assert read_receipt(tmp_path) == record


@pytest.mark.parametrize("content", [b"", b"done\n", b"2024-01-01 uploaded to s3://b/p\n", b"  \n"])
def test_legacy_plain_text_receipt_is_detected_and_cannot_authorize_pruning(tmp_path, content):
    (tmp_path / FILENAME).write_bytes(content)
    assert is_legacy_receipt(tmp_path)
    assert is_legacy_receipt(tmp_path / FILENAME)
    with pytest.raises(LegacyRecord) as info:
        read_receipt(tmp_path)
    assert "legacy plain-text marker" in str(info.value) and "cannot authorize pruning" in str(info.value)
    assert FILENAME in str(info.value)


def test_json_and_absent_receipts_are_not_legacy(tmp_path):
    assert not is_legacy_receipt(tmp_path)
    write_receipt(tmp_path, make_receipt(0))
    assert not is_legacy_receipt(tmp_path)
    (tmp_path / FILENAME).write_bytes(b"\xef\xbb\xbf{}")
    assert not is_legacy_receipt(tmp_path)  # a BOM'd JSON receipt is refused as such, not as legacy


@pytest.mark.parametrize(
    "stamp",
    ["2025-01-31 12:00:00Z", "2025-01-31T12:00:00+01:00", "2025-01-31T12:00:00", "2025-02-30T00:00:00Z", "x",
     "2025-01-31T12:00:60Z", "2025-01-31T24:00:00Z", "2025-13-01T00:00:00Z"],
)
def test_receipt_time_must_be_iso_8601_utc(stamp):
    data = make_receipt(0).to_dict()
    data["uploaded_at"] = stamp
    with pytest.raises(InvalidRecord, match=r"uploaded_at"):
        parse_receipt(encode_json(data))


@pytest.mark.parametrize("stamp", ["2025-01-31T12:00:00Z", "2024-02-29T23:59:59.5Z", "2025-01-31T12:00:00.12345+00:00"])
def test_receipt_time_accepts_every_iso_8601_utc_form_on_every_python(stamp):
    data = make_receipt(0).to_dict()
    data["uploaded_at"] = stamp
    assert parse_receipt(encode_json(data)).uploaded_at == stamp


def test_receipt_server_checksums_round_trip_and_are_optional_on_read(tmp_path):
    import dataclasses

    b64 = "A" * 43 + "="
    record = dataclasses.replace(make_receipt(0), server_checksums={"model.pt": b64, "optim/.metadata": b64 + "-3"})
    write_receipt(tmp_path, record)
    assert read_receipt(tmp_path) == record
    older = make_receipt(0).to_dict()
    assert "server_checksums" not in older  # a receipt written before the field existed still reads
    assert parse_receipt(encode_json(older)).server_checksums is None
    assert dataclasses.replace(make_receipt(0), server_checksums={}).to_dict()["server_checksums"] == {}


@pytest.mark.parametrize("checksums, match", [
    ({"other.pt": "A" * 43 + "="}, r"server_checksums names \['other\.pt'\]"),
    ({"model.pt": "not base64"}, r"server_checksums"),
])
def test_receipt_server_checksums_are_validated(checksums, match):
    data = make_receipt(0).to_dict()
    data["server_checksums"] = checksums
    with pytest.raises(InvalidRecord, match=match):
        parse_receipt(encode_json(data))


def test_receipt_keeps_each_earlier_destinations_server_checksums(tmp_path):
    import dataclasses

    b64 = "A" * 43 + "="
    now = make_receipt(0)
    old, older = (dataclasses.replace(now.destination, bucket=b) for b in ("old-ckpts", "older-ckpts"))
    record = dataclasses.replace(now, server_checksums={"model.pt": b64}, earlier_destinations=(old, older),
                                 earlier_server_checksums=({"model.pt": b64 + "-2"}, None))
    write_receipt(tmp_path, record)
    assert read_receipt(tmp_path) == record
    assert [record.checksums_at(d) for d in record.destinations] == [{"model.pt": b64}, {"model.pt": b64 + "-2"}, None]
    assert record.at(old) == dataclasses.replace(now, destination=old, server_checksums={"model.pt": b64 + "-2"})
    data = record.to_dict()
    data["earlier_server_checksums"] = data["earlier_server_checksums"][:1]
    with pytest.raises(InvalidRecord, match="earlier_server_checksums has 1 entries for 2 earlier destinations"):
        parse_receipt(encode_json(data))
