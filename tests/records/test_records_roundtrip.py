"""Every record survives write → read unchanged, and equal content always gives equal bytes."""

from __future__ import annotations

import json

from records_samples import inventory_of

from ckptflow.jsonio import encode_json
from ckptflow.records.legacy_manifest import read_legacy_manifest, write_legacy_manifest


def test_written_record_reads_back_equal(spec, tmp_path):
    record = spec.make(0)
    spec.write(tmp_path, record)
    assert spec.read(tmp_path) == record


def test_writing_the_same_record_twice_gives_identical_bytes(spec, tmp_path):
    path = spec.locate(tmp_path)
    spec.write(tmp_path, spec.make(0))
    first = path.read_bytes()
    spec.write(tmp_path, spec.make(0))
    assert path.read_bytes() == first == spec.encode(spec.make(0))


def test_written_bytes_are_canonical_json_with_sorted_keys(spec, tmp_path):
    spec.write(tmp_path, spec.make(0))
    data = spec.locate(tmp_path).read_bytes()
    assert data == encode_json(json.loads(data))
    assert not data.startswith(b"\xef\xbb\xbf") and data.endswith(b"\n")


def test_parse_of_encoded_bytes_gives_the_record(spec):
    record = spec.make(1)
    assert spec.parse(spec.encode(record)) == record


def test_unsorted_inventory_comes_out_sorted(inventory_spec, tmp_path):
    spec = inventory_spec
    spec.write(tmp_path, spec.make(0))
    on_disk = json.loads(spec.locate(tmp_path).read_bytes())
    paths = [e["path"] for e in inventory_of(on_disk, spec.inventory)]
    assert paths == sorted(paths) and len(paths) > 1

    reversed_data = json.loads(spec.locate(tmp_path).read_bytes())
    inventory_of(reversed_data, spec.inventory).reverse()
    assert spec.parse(encode_json(reversed_data)) == spec.read(tmp_path)


def test_different_content_gives_different_bytes(spec):
    assert spec.encode(spec.make(0)) != spec.encode(spec.make(1))


def test_legacy_manifest_keeps_the_original_bytes_verbatim(tmp_path):
    original = b'{ "z": 1,\n  "a": [1, 2.50],\t"nested": {"k": "\\u00e9"} }'  # unsorted, odd spacing
    path = write_legacy_manifest(tmp_path, original)
    assert path.read_bytes() == original
    assert read_legacy_manifest(tmp_path) == original
    assert read_legacy_manifest(path) == original
