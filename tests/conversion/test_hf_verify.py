"""verify_output: every check it makes (shards and index, sidecars, tensor count, tensor bits against the
checkpoint), each shown to catch the fault it exists for."""

from __future__ import annotations

import json
import re

import pytest
from conversion_helpers import ALL_KINDS, MOE_KINDS, copy_tree, drop_tensor, flip_tensor_byte, shard_of

from ckptflow.conversion.verify import verify_output
from ckptflow.errors import VerificationFailed
from helpers import tiny_models as tm

ALL = dict(min_tensors=0, probe_count=10_000, expert_probe_count=10_000)
IDENTITY_CHECKS = ("tensor_count", "index_headers", "key_coverage", "config_identity", "sidecar_identity")


def _copy(tiny, kind, tmp_path):
    return copy_tree(tiny.export(kind), tmp_path / "export")


def _fails(out, tiny, kind, fragment, **kwargs):
    options = {**ALL, **kwargs}
    with pytest.raises(VerificationFailed, match=fragment) as err:
        verify_output(out, tiny.base(kind), tiny.checkpoint(kind), **options)
    return err.value


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_good_export_passes_every_check(tiny, kind):
    summary = verify_output(tiny.export(kind), tiny.base(kind), tiny.checkpoint(kind), min_tensors=0)
    moe = kind in MOE_KINDS
    expected = (*IDENTITY_CHECKS, "checkpoint_accounting", "bitwise_probe") + (("expert_layout",) if moe else ())
    assert summary.checks == expected
    assert summary.tensors_verified and summary.probed
    assert bool(summary.probed_experts) == moe
    assert any("embed_tokens" in k for k in summary.probed)
    assert json.loads(json.dumps(summary.to_dict()))["tensor_count"] == summary.tensor_count


def test_dense_vlms_verify_with_tensor_probes(tiny):
    for kind in ("qwen2_5_vl", "qwen3_5"):
        summary = verify_output(tiny.export(kind), tiny.base(kind), tiny.checkpoint(kind), **ALL)
        assert summary.tensors_verified and len(summary.probed) == summary.tensor_count


def test_min_tensors_floor_comes_before_tensor_verification(tiny, tmp_path):
    # Default floor 800 > a tiny model's tensor count; the checkpoint is not even opened.
    with pytest.raises(VerificationFailed, match="fewer than the floor of 800"):
        verify_output(tiny.export("qwen3"), tiny.base("qwen3"), tmp_path / "absent.pt")
    with pytest.raises(VerificationFailed, match="fewer than the floor of 25"):
        verify_output(tiny.export("qwen3"), tiny.base("qwen3"), tiny.checkpoint("qwen3"), min_tensors=25)
    assert verify_output(tiny.export("qwen3"), tiny.base("qwen3"), tiny.checkpoint("qwen3"), min_tensors=24).tensor_count == 24


def test_expect_tensors_is_an_exact_count_when_set(tiny):
    export, base, ckpt = tiny.export("qwen3_moe"), tiny.base("qwen3_moe"), tiny.checkpoint("qwen3_moe")
    assert verify_output(export, base, ckpt, min_tensors=0, expect_tensors=45).tensor_count == 45
    with pytest.raises(VerificationFailed, match="--expect-tensors says 44"):
        verify_output(export, base, ckpt, min_tensors=0, expect_tensors=44)


def test_corrupted_shard_header_is_caught(tiny, tmp_path):
    out = _copy(tiny, "qwen3_5", tmp_path)
    shard = shard_of(out, "model.language_model.norm.weight")
    raw = bytearray(shard.read_bytes())
    pos = raw.index(b'"BF16"')
    raw[pos : pos + 6] = b'"BF17"'
    shard.write_bytes(bytes(raw))
    err = _fails(out, tiny, "qwen3_5", "unsupported dtype 'BF17'", verify_tensors=False)
    assert shard.name in str(err)


def test_truncated_shard_is_caught(tiny, tmp_path):
    out = _copy(tiny, "qwen3_moe", tmp_path)
    shard = shard_of(out, "lm_head.weight")
    shard.write_bytes(shard.read_bytes()[:-1])
    _fails(out, tiny, "qwen3_moe", "header \\+ data", verify_tensors=False)


def test_missing_key_is_caught(tiny, tmp_path):
    out = _copy(tiny, "qwen2_5_vl", tmp_path)
    drop_tensor(out, "visual.merger.ln_q.weight")
    _fails(out, tiny, "qwen2_5_vl", "1 missing \\['visual.merger.ln_q.weight'\\]", verify_tensors=False)


def test_index_naming_a_key_its_shard_lacks_is_caught(tiny, tmp_path):
    out = _copy(tiny, "qwen3", tmp_path)
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    key = next(k for k, v in index["weight_map"].items() if v == shards[0])
    index["weight_map"][key] = shards[-1]
    index_path.write_text(json.dumps(index))
    _fails(out, tiny, "qwen3", "does not hold what model.safetensors.index.json says", verify_tensors=False)


def test_wrong_total_size_is_caught(tiny, tmp_path):
    out = _copy(tiny, "qwen3", tmp_path)
    index_path = out / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["metadata"]["total_size"] += 2
    index_path.write_text(json.dumps(index))
    _fails(out, tiny, "qwen3", "metadata.total_size", verify_tensors=False)


def test_a_stray_weight_file_is_caught(tiny, tmp_path):
    out = _copy(tiny, "qwen3", tmp_path)
    (out / "model.safetensors").write_bytes(b"")
    _fails(out, tiny, "qwen3", "weight files its index does not list: \\['model.safetensors'\\]", verify_tensors=False)


@pytest.mark.parametrize("verify_tensors", [True, False])
@pytest.mark.parametrize("name", ["tokenizer_config.json", "chat_template.jinja", "preprocessor_config.json",
                                  "additional_chat_templates/tool_use.jinja"])
def test_changed_sidecar_is_caught(tiny, tmp_path, name, verify_tensors):
    out = _copy(tiny, "qwen2_5_vl", tmp_path)
    (out / name).write_bytes((out / name).read_bytes() + b" ")
    err = _fails(out, tiny, "qwen2_5_vl", "differs from the base", verify_tensors=verify_tensors)
    assert name in str(err)


def test_missing_sidecar_is_caught(tiny, tmp_path):
    out = _copy(tiny, "qwen3_5", tmp_path)
    (out / "generation_config.json").unlink()
    _fails(out, tiny, "qwen3_5", "generation_config.json is missing", verify_tensors=False)


@pytest.mark.parametrize("verify_tensors", [True, False])
def test_changed_config_is_caught(tiny, tmp_path, verify_tensors):
    out = _copy(tiny, "qwen3", tmp_path)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))  # same content, other bytes
    _fails(out, tiny, "qwen3", "config .*config.json differs", verify_tensors=verify_tensors)


def test_a_bitwise_different_tensor_is_caught_and_no_verify_skips_only_that(tiny, tmp_path):
    out = _copy(tiny, "qwen3_5", tmp_path)
    key = "model.language_model.layers.2.linear_attn.A_log"
    flip_tensor_byte(out, key, offset=1)
    err = _fails(out, tiny, "qwen3_5", f"tensor {key} in .* differs from the checkpoint's bytes \\(first at byte 1\\)")
    assert shard_of(out, key).name in str(err)
    summary = verify_output(out, tiny.base("qwen3_5"), tiny.checkpoint("qwen3_5"), verify_tensors=False, **ALL)
    assert summary.checks == IDENTITY_CHECKS and not summary.tensors_verified and not summary.probed


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen3_vl_moe_hub"])
def test_a_bitwise_different_expert_is_caught(tiny, tmp_path, kind):
    out = _copy(tiny, kind, tmp_path)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    key = next(k for k in index["weight_map"] if ".experts." in k and "down_proj" in k)
    flip_tensor_byte(out, key, offset=3)
    _fails(out, tiny, kind, f"expert tensor {key} in .* differs")


def test_export_of_another_checkpoint_fails_the_probe(tiny, tmp_path):
    other = tm.save_consolidated(tm.in_memory_state_dict(tiny.base("qwen3")), tmp_path / "other.pt")
    with pytest.raises(VerificationFailed, match="differs from the checkpoint's bytes"):
        verify_output(tiny.export("qwen3"), tiny.base("qwen3"), other, **ALL)


def test_moe_base_requires_checkpoint_experts(tiny, tmp_path):
    dense = {k: v for k, v in tiny.state_dict("qwen3_moe").items() if ".experts." not in k}
    model_pt = tm.save_consolidated(dense, tmp_path / "model.pt")
    with pytest.raises(VerificationFailed, match="missing") as err:
        verify_output(tiny.export("qwen3_moe"), tiny.base("qwen3_moe"), model_pt, **ALL)
    assert str(model_pt) in str(err.value)


def test_export_without_index_is_caught(tiny, tmp_path):
    out = _copy(tiny, "qwen3", tmp_path)
    (out / "model.safetensors.index.json").unlink()
    _fails(out, tiny, "qwen3", "neither model.safetensors.index.json nor model.safetensors", verify_tensors=False)


def test_index_with_a_bom_is_caught(tiny, tmp_path):
    out = _copy(tiny, "qwen3", tmp_path)
    index_path = out / "model.safetensors.index.json"
    index_path.write_bytes(b"\xef\xbb\xbf" + index_path.read_bytes())
    _fails(out, tiny, "qwen3", "byte-order mark", verify_tensors=False)


@pytest.mark.parametrize(
    ("kind", "stray"),
    [
        ("qwen3", "vocab.json"),
        ("qwen3", "additional_chat_templates/"),  # this base has no template directory, even an empty one
        ("qwen2_5_vl", "additional_chat_templates/extra.jinja"),
        ("qwen3", "extra/"),
    ],
)
def test_a_file_the_base_does_not_have_is_caught(tiny, tmp_path, kind, stray):
    out = _copy(tiny, kind, tmp_path)
    target = out / stray.rstrip("/")
    if stray.endswith("/"):
        target.mkdir()
    else:
        target.write_text("{}")
    _fails(out, tiny, kind, "files the base does not have: .*" + re.escape(stray), verify_tensors=False)


def test_hidden_marker_files_are_allowed(tiny, tmp_path):
    out = _copy(tiny, "qwen3", tmp_path)
    (out / ".materialized").write_text("{}")
    assert verify_output(out, tiny.base("qwen3"), tiny.checkpoint("qwen3"), **ALL).tensors_verified
