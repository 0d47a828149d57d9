"""Malformed records are refused by name: the message names the file and what is wrong with it."""

from __future__ import annotations

from dataclasses import replace

import pytest
from records_samples import hexd, inventory_of

from ckptflow.errors import InvalidRecord, NotFound, UnsafePath
from ckptflow.jsonio import encode_json
from ckptflow.records import LegacyRecord, read_receipt
from ckptflow.records.inventory import FileEntry

MALFORMED = {
    "utf8_bom": (b'\xef\xbb\xbf{"protocol": "x"}', "byte-order mark"),
    "json_array": (b"[]", "JSON object"),
    "json_string": (b'"x"', "JSON object"),
    "json_number": (b"1", "JSON object"),
    "nan": (b'{"size": NaN}', "NaN"),
    "infinity": (b'{"size": Infinity}', "Infinity"),
    "negative_infinity": (b'{"size": -Infinity}', "Infinity"),
    "duplicate_keys": (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
    "invalid_utf8": (b'{"a": "\xff\xfe"}', "not valid UTF-8"),
    "truncated": (b'{"a": ', "not valid JSON"),
}


def _refusal(spec, tmp_path, data: bytes, exc_type=InvalidRecord) -> str:
    path = spec.locate(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    with pytest.raises(exc_type) as info:
        spec.read(tmp_path)
    message = str(info.value)
    assert path.name in message, message
    return message


@pytest.mark.parametrize("case", MALFORMED, ids=list(MALFORMED))
def test_malformed_json_is_refused_by_name(any_file_spec, tmp_path, case):
    data, problem = MALFORMED[case]
    if any_file_spec.name in ("receipt", "checkpoint_receipt") and not data.startswith((b"{", b"\xef\xbb\xbf")):
        problem = "legacy plain-text marker"  # a non-JSON .uploaded is an old marker, refused as such
    assert problem in _refusal(any_file_spec, tmp_path, data)


def test_missing_record_is_not_found_by_name(any_file_spec, tmp_path):
    if any_file_spec.name == "probe":
        assert any_file_spec.read(tmp_path) is None  # an absent probe record just means "not probed"
        return
    with pytest.raises(NotFound, match=r"does not exist"):
        any_file_spec.read(tmp_path)


@pytest.mark.parametrize(
    ("found", "exc_type", "remedy"),
    [
        ("{family}.v9", InvalidRecord, "upgrade ckptflow"),
        ("{family}.v0", LegacyRecord, ""),
        ("someone-else.thing.v1", InvalidRecord, "not a"),
        (7, InvalidRecord, "not a string"),
    ],
    ids=["newer", "older", "foreign", "not_a_string"],
)
def test_unknown_protocol_is_refused_by_name(spec, tmp_path, found, exc_type, remedy):
    data = spec.make(0).to_dict()
    ours = data[spec.protocol_key]
    if isinstance(found, str):
        found = found.format(family=ours.rsplit(".v", 1)[0])
    data[spec.protocol_key] = found
    message = _refusal(spec, tmp_path, encode_json(data), exc_type)
    assert f"{spec.protocol_key} {found!r}" in message and repr(ours) in message and remedy in message
    if exc_type is InvalidRecord:
        assert not isinstance(_catch(spec, tmp_path), LegacyRecord)


def _catch(spec, tmp_path) -> Exception:
    try:
        spec.read(tmp_path)
    except InvalidRecord as exc:
        return exc
    raise AssertionError("expected a refusal")


def test_newer_protocol_message_says_upgrade(tmp_path):
    (tmp_path / ".uploaded").write_bytes(b'{"protocol": "posttrain.archive-marker.v9"}')
    with pytest.raises(InvalidRecord) as info:
        read_receipt(tmp_path)
    assert str(info.value) == (
        f"`.uploaded` in {tmp_path} has protocol 'posttrain.archive-marker.v9', "
        "this ckptflow reads 'posttrain.archive-marker.v1'; upgrade ckptflow"
    )


def test_record_without_protocol_is_a_legacy_record(spec, tmp_path):
    data = spec.make(0).to_dict()
    del data[spec.protocol_key]
    assert "no" in _refusal(spec, tmp_path, encode_json(data), LegacyRecord)


def test_unknown_field_is_refused_by_name(spec, tmp_path):
    data = spec.make(0).to_dict()
    data["surprise"] = 1
    assert "'surprise' was unexpected" in _refusal(spec, tmp_path, encode_json(data))


BAD_PATHS = {
    "dotdot": ("../escape", UnsafePath, "'..' segment"),
    "inner_dotdot": ("a/../../b", UnsafePath, "'..' segment"),
    "absolute": ("/etc/passwd", UnsafePath, "is absolute"),
    "drive": ("C:/x", UnsafePath, "is absolute"),
    "backslash": ("a\\b", UnsafePath, "backslash"),
    "nul": ("a\x00b", UnsafePath, "NUL"),
    "empty_segment": ("a//b", UnsafePath, "empty"),
}


@pytest.mark.parametrize("case", BAD_PATHS, ids=list(BAD_PATHS))
def test_unsafe_inventory_path_is_refused_by_name(inventory_spec, tmp_path, case):
    bad, exc_type, problem = BAD_PATHS[case]
    data = inventory_spec.make(0).to_dict()
    inventory_of(data, inventory_spec.inventory)[-1]["path"] = bad
    message = _refusal(inventory_spec, tmp_path, encode_json(data), exc_type)
    assert problem in message and repr(bad) in message


def _mutate_inventory(data, keys, case):
    inventory = inventory_of(data, keys)
    last = inventory[-1]
    if case == "duplicate":
        inventory.append(dict(last))
    elif case == "file_and_directory":
        inventory.append({**last, "path": last["path"] + "/inner"})
    elif case == "uppercase_digest":
        last["sha256"] = hexd("A")
    elif case == "short_digest":
        last["sha256"] = "a" * 63
    elif case == "negative_size":
        last["size"] = -1
    elif case == "float_size":
        last["size"] = 1.0
    elif case == "missing_digest":
        del last["sha256"]


BAD_ENTRIES = {
    "duplicate": "twice",
    "file_and_directory": "as a file and as the directory of",
    "uppercase_digest": "does not match '^[0-9a-f]{64}$'",
    "short_digest": "does not match '^[0-9a-f]{64}$'",
    "negative_size": "less than the minimum of 0",
    "float_size": "not a non-negative integer",
    "missing_digest": "'sha256' is a required property",
}


@pytest.mark.parametrize("case", BAD_ENTRIES, ids=list(BAD_ENTRIES))
def test_bad_inventory_entry_is_refused_by_name(inventory_spec, tmp_path, case):
    data = inventory_spec.make(0).to_dict()
    _mutate_inventory(data, inventory_spec.inventory, case)
    assert BAD_ENTRIES[case] in _refusal(inventory_spec, tmp_path, encode_json(data))


def _with_extra_entry(spec, record, entry):
    if spec.name == "manifest":
        optim = record.components["optim"]
        extra = replace(optim, files=(*optim.files, entry))
        return replace(record, components={**record.components, "optim": extra})
    field = spec.inventory[-1]
    return replace(record, **{field: (*getattr(record, field), entry)})


@pytest.mark.parametrize("case", ["dotdot", "absolute", "nul"])
def test_invalid_record_is_refused_before_a_byte_is_written(inventory_spec, tmp_path, case):
    bad = BAD_PATHS[case][0]
    record = _with_extra_entry(inventory_spec, inventory_spec.make(0), FileEntry(bad, 1, hexd("a")))
    with pytest.raises(UnsafePath):
        inventory_spec.write(tmp_path, record)
    with pytest.raises(UnsafePath):
        inventory_spec.encode(record)
    assert not inventory_spec.locate(tmp_path).exists()
    assert list(tmp_path.iterdir()) in ([], [tmp_path / "cache"])
