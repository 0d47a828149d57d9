"""Shards: Hugging Face names, a size cap, an index written last with total_size and the full weight_map."""

from __future__ import annotations

import json
import struct

import pytest
from conversion_helpers import SHARD_CAP, base_tensors, read_raw_header

from ckptflow.conversion import hf, shards
from ckptflow.conversion.hf import convert_checkpoint
from ckptflow.conversion.shards import plan_shards, read_header
from ckptflow.errors import InvalidRecord


def _index(directory):
    return json.loads((directory / "model.safetensors.index.json").read_text())


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen3_5"])
def test_shards_are_named_capped_and_indexed(tiny, kind):
    export = tiny.export(kind)
    index = _index(export)
    names = sorted(set(index["weight_map"].values()))
    n = len(names)
    assert n > 1
    assert names == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    assert sorted(p.name for p in export.glob("*.safetensors")) == names
    total = 0
    for name in names:
        header, _ = read_raw_header(export / name)
        assert header.pop("__metadata__") == {"format": "pt"}
        sizes = [v["data_offsets"][1] - v["data_offsets"][0] for v in header.values()]
        assert sum(sizes) <= SHARD_CAP or len(sizes) == 1
        assert {k for k, v in index["weight_map"].items() if v == name} == set(header)
        total += sum(sizes)
    assert index["metadata"] == {"total_size": total}
    assert set(index["weight_map"]) == set(base_tensors(tiny.base(kind)))
    assert list(index["weight_map"]) == sorted(index["weight_map"])


def test_default_cap_gives_one_shard_with_an_index(tiny, tmp_path):
    result = convert_checkpoint(tiny.checkpoint("qwen3"), tiny.base("qwen3"), tmp_path / "out")
    assert [s.name for s in result.shards] == ["model-00001-of-00001.safetensors"]
    report = json.loads(json.dumps(result.to_dict()))
    assert report["tensor_count"] == 24 and report["mapping"] == "transformers:Qwen3ForCausalLM"
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file()
    assert result.shards[0].size == (tmp_path / "out" / result.shards[0].name).stat().st_size


def test_a_tensor_larger_than_the_cap_gets_a_shard_of_its_own(tiny, tmp_path):
    result = convert_checkpoint(tiny.checkpoint("qwen3"), tiny.base("qwen3"), tmp_path / "out", max_shard_bytes=1)
    assert len(result.shards) == result.tensor_count
    assert all(s.tensors == 1 for s in result.shards)


def test_tensors_keep_the_base_order(tiny):
    export, base = tiny.export("qwen3_5"), tiny.base("qwen3_5")

    def order(directory):
        keys = []
        for name in sorted(set(_index(directory)["weight_map"].values())):
            header, _ = read_raw_header(directory / name)
            header.pop("__metadata__", None)
            keys += sorted(header, key=lambda k: header[k]["data_offsets"][0])
        return keys

    assert order(export) == order(base)


def test_plan_shards_fills_greedily_in_order():
    sizes = [("a", 4), ("b", 4), ("c", 3), ("d", 10), ("e", 1)]
    assert plan_shards(sizes, 8) == [["a", "b"], ["c"], ["d"], ["e"]]
    assert plan_shards(sizes, 100) == [["a", "b", "c", "d", "e"]]
    assert plan_shards([], 8) == []
    with pytest.raises(ValueError):
        plan_shards(sizes, 0)


def test_index_is_written_last_when_a_shard_fails(tiny, tmp_path, monkeypatch):
    real = shards.write_shard
    calls = []

    def failing(path, *args, **kwargs):
        calls.append(path.name)
        if len(calls) == 2:
            raise OSError("disk full")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(shards, "write_shard", failing)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="disk full"):
        convert_checkpoint(tiny.checkpoint("qwen3_moe"), tiny.base("qwen3_moe"), out, max_shard_bytes=SHARD_CAP)
    assert not (out / "model.safetensors.index.json").exists()
    assert not (out / "config.json").exists()


def test_index_is_written_after_the_sidecars(tiny, tmp_path, monkeypatch):
    def failing(*args, **kwargs):
        raise OSError("sidecar copy failed")

    monkeypatch.setattr(hf.sidecars, "copy_sidecars", failing)
    out = tmp_path / "out"
    with pytest.raises(OSError, match="sidecar copy failed"):
        convert_checkpoint(tiny.checkpoint("qwen3"), tiny.base("qwen3"), out)
    assert list(out.glob("*.safetensors")) and not (out / "model.safetensors.index.json").exists()


def test_progress_counts_every_tensor_byte(tiny, tmp_path, monkeypatch):
    seen = []
    real = hf.ByteProgress

    class Recording(real):
        def update(self, nbytes):
            seen.append(nbytes)
            super().update(nbytes)

    monkeypatch.setattr(hf, "ByteProgress", Recording)
    result = convert_checkpoint(tiny.checkpoint("qwen3_moe"), tiny.base("qwen3_moe"), tmp_path / "out", progress=False)
    assert sum(seen) == result.total_size


# --- header validation -----------------------------------------------------------------------------------

def _write(path, header: dict, data: bytes, *, raw_header: bytes | None = None):
    raw = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


GOOD = {"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}


def test_a_valid_header_is_read(tmp_path):
    header = read_header(_write(tmp_path / "x.safetensors", GOOD, bytes(12)))
    assert list(header.entries) == ["a", "b"] and header.file_size == header.data_start + 12


@pytest.mark.parametrize(
    ("header", "data", "fragment"),
    [
        (GOOD, bytes(11), "header \\+ data = 147"),  # truncated data
        (GOOD, bytes(13), "is 148 bytes but header \\+ data = 147"),  # trailing bytes
        ({"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [4, 12]}}, bytes(12), "starts at 4, expected 0"),
        ({**GOOD, "b": {"dtype": "F32", "shape": [1], "data_offsets": [6, 10]}}, bytes(10), "spans|starts at"),
        ({"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), "spans 8 bytes, BF16\\[3\\] needs 6"),
        ({"a": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}, bytes(1), "unsupported dtype 'Q4'"),
        ({"a": {"dtype": "BF16", "shape": [-1], "data_offsets": [0, 2]}}, bytes(2), "not a list of non-negative"),
        ({"a": {"dtype": "BF16", "shape": [1], "data_offsets": [0]}}, bytes(2), "data_offsets"),
        ({"a": {"dtype": "BF16", "shape": [1]}}, bytes(2), "is not \\{dtype, shape, data_offsets\\}"),
        ({"__metadata__": {"format": 1}, **GOOD}, bytes(12), "__metadata__"),
    ],
)
def test_malformed_headers_are_refused_by_name(tmp_path, header, data, fragment):
    path = _write(tmp_path / "x.safetensors", header, data)
    with pytest.raises(InvalidRecord, match=fragment) as err:
        read_header(path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (b"\xef\xbb\xbf" + json.dumps(GOOD).encode(), "byte-order mark"),
        (b'{"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}, "a": {}}', "duplicate key"),
        (b"[1, 2]", "JSON object"),
        (b"{not json", "not valid JSON"),
    ],
)
def test_undecodable_headers_are_refused(tmp_path, raw, fragment):
    path = _write(tmp_path / "x.safetensors", {}, bytes(12), raw_header=raw)
    with pytest.raises(InvalidRecord, match=fragment):
        read_header(path)


def test_a_header_longer_than_the_file_is_refused(tmp_path):
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(InvalidRecord, match="declares a 1000-byte header"):
        read_header(path)


def test_written_shards_pass_the_safetensors_reader(tiny):
    from safetensors import safe_open

    export = tiny.export("qwen2_5_vl")
    for name in set(_index(export)["weight_map"].values()):
        raw = (export / name).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        assert n % 8 == 0
        with safe_open(str(export / name), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}


def test_the_torch_free_item_sizes_match_torch_for_every_dtype_name():
    import torch

    from ckptflow.conversion.dtypes import ITEMSIZE
    from ckptflow.conversion.layout import DTYPES

    assert set(ITEMSIZE) == set(DTYPES)
    assert {name: torch.empty(0, dtype=dt).element_size() for name, dt in DTYPES.items()} == ITEMSIZE
