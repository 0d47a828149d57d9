"""Strict key accounting: every base tensor produced once, every checkpoint tensor consumed once, or a refusal."""

from __future__ import annotations

import json
import pickle
import re

import pytest
import torch
from conversion_helpers import add_tensor_to_base, base_tensors, copy_tree

from ckptflow.conversion.hf import convert_checkpoint
from ckptflow.conversion.layout import KeyMapper, TensorInfo, describe
from ckptflow.errors import InvalidRecord, NotFound, Refused
from helpers import tiny_models as tm


def _refused(tiny, kind, state_dict, tmp_path) -> Refused:
    model_pt = tm.save_consolidated(state_dict, tmp_path / "model.pt")
    out = tmp_path / "out"
    with pytest.raises(Refused) as err:
        convert_checkpoint(model_pt, tiny.base(kind), out)
    assert not out.exists(), "a refused conversion must not write anything"
    assert str(model_pt) in str(err.value)
    return err.value


def test_missing_key_is_refused_by_name(tiny, tmp_path):
    sd = dict(tiny.state_dict("qwen3"))
    del sd["model.norm.weight"]
    err = _refused(tiny, "qwen3", sd, tmp_path)
    assert err.accounting.missing == ["model.norm.weight"]
    assert "1 missing: model.norm.weight" in str(err)


def test_extra_key_is_refused_by_name(tiny, tmp_path):
    sd = {**tiny.state_dict("qwen3"), "model.layers.9.mlp.gate_proj.weight": torch.zeros(2, 2, dtype=torch.bfloat16)}
    err = _refused(tiny, "qwen3", sd, tmp_path)
    assert err.accounting.extra == ["model.layers.9.mlp.gate_proj.weight"] and not err.accounting.missing


def test_shape_mismatch_is_refused(tiny, tmp_path):
    sd = dict(tiny.state_dict("qwen2_5_vl"))
    key = "model.language_model.layers.0.mlp.up_proj.weight"
    sd[key] = sd[key][:-1]
    err = _refused(tiny, "qwen2_5_vl", sd, tmp_path)
    # Reported under the base's on-disk name, with both shapes.
    [line] = err.accounting.mismatched
    assert line.startswith("model.layers.0.mlp.up_proj.weight: shape [96, 64]") and "[95, 64]" in line


def test_dtype_mismatch_is_refused(tiny, tmp_path):
    sd = dict(tiny.state_dict("qwen3_5"))
    key = "model.visual.blocks.0.norm1.weight"
    sd[key] = sd[key].float()
    err = _refused(tiny, "qwen3_5", sd, tmp_path)
    assert err.accounting.mismatched == [f"{key}: dtype BF16 in base, F32 from {key}"]


def test_expert_dtype_mismatch_names_the_fused_source(tiny, tmp_path):
    sd = dict(tiny.state_dict("qwen3_moe"))
    key = "model.layers.1.mlp.experts.down_proj"
    sd[key] = sd[key].float()
    err = _refused(tiny, "qwen3_moe", sd, tmp_path)
    assert len(err.accounting.mismatched) == 4  # one per expert's down_proj in the base
    assert all(key in line and "F32" in line for line in err.accounting.mismatched)


def test_a_missing_expert_is_refused(tiny, tmp_path):
    sd = dict(tiny.state_dict("qwen3_moe"))
    for proj in ("gate_up_proj", "down_proj"):
        key = f"model.layers.0.mlp.experts.{proj}"
        sd[key] = sd[key][:3]  # 3 experts instead of 4
    err = _refused(tiny, "qwen3_moe", sd, tmp_path)
    assert err.accounting.missing == [
        f"model.layers.0.mlp.experts.3.{p}.weight" for p in ("down_proj", "gate_proj", "up_proj")
    ]


def test_fused_experts_with_disagreeing_expert_counts_are_refused(tiny, tmp_path):
    sd = dict(tiny.state_dict("qwen3_moe"))
    key = "model.layers.0.mlp.experts.gate_up_proj"
    sd[key] = sd[key][:3]
    model_pt = tm.save_consolidated(sd, tmp_path / "model.pt")
    with pytest.raises(InvalidRecord, match=re.escape("fused experts model.layers.0.mlp.experts have shapes gate_up [3, 96, 64]")):
        convert_checkpoint(model_pt, tiny.base("qwen3_moe"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_same_weight_given_twice_is_refused(tiny, tmp_path):
    sd = dict(tiny.state_dict("qwen3_moe"))
    fused = sd["model.layers.0.mlp.experts.down_proj"]
    sd["model.layers.0.mlp.experts.2.down_proj.weight"] = fused[2].clone()
    err = _refused(tiny, "qwen3_moe", sd, tmp_path)
    assert err.accounting.duplicated == [
        "model.layers.0.mlp.experts.2.down_proj.weight <- model.layers.0.mlp.experts.down_proj, "
        "model.layers.0.mlp.experts.2.down_proj.weight"
    ]


def test_both_names_of_one_vlm_weight_are_refused(tiny, tmp_path):
    sd = dict(tiny.state_dict("qwen2_5_vl"))
    sd["visual.merger.ln_q.weight"] = sd["model.visual.merger.ln_q.weight"].clone()
    err = _refused(tiny, "qwen2_5_vl", sd, tmp_path)
    assert len(err.accounting.duplicated) == 1 and "visual.merger.ln_q.weight" in err.accounting.duplicated[0]


def test_both_names_of_one_fused_expert_tensor_are_refused(tiny):
    # qwen2_5_vl's renames map model.layers.* to model.language_model.*: two spellings, one tensor.
    mapper = KeyMapper.for_base(tiny.base("qwen2_5_vl"))
    info = TensorInfo((4, 64, 48), "BF16")
    infos = {"model.layers.0.mlp.experts.down_proj": info, "model.language_model.layers.0.mlp.experts.down_proj": info}
    with pytest.raises(InvalidRecord, match=re.escape("are both model.language_model.layers.0.mlp.experts.down_proj")):
        describe(infos, mapper, what="checkpoint x.pt")


def test_counts_and_the_first_twenty_are_reported(tiny, tmp_path):
    sd = dict(tiny.state_dict("qwen3_5"))
    dropped = sorted(k for k in sd if k.startswith("model.visual."))[:25]
    for key in dropped:
        del sd[key]
    err = _refused(tiny, "qwen3_5", sd, tmp_path)
    assert len(err.accounting.missing) == 25
    assert "25 missing: " in str(err) and "(+5 more)" in str(err)
    assert err.accounting.to_dict()["missing"]["count"] == 25
    assert len(err.accounting.to_dict()["missing"]["first"]) == 20


def test_tied_lm_head_is_dropped_only_when_equal_to_the_embedding(tiny, tmp_path):
    sd = dict(tiny.state_dict("qwen3"))
    assert sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
    sd["lm_head.weight"] = sd["lm_head.weight"].clone()
    sd["lm_head.weight"][0, 0] += 1
    err = _refused(tiny, "qwen3", sd, tmp_path)
    assert "lm_head.weight differs from model.embed_tokens.weight" in str(err)


def test_tied_lm_head_may_be_absent_from_the_checkpoint(tiny, tmp_path):
    sd = {k: v for k, v in tiny.state_dict("qwen3").items() if k != "lm_head.weight"}
    model_pt = tm.save_consolidated(sd, tmp_path / "model.pt")
    result = convert_checkpoint(model_pt, tiny.base("qwen3"), tmp_path / "out")
    assert result.tied == {}
    assert "lm_head.weight" not in base_tensors(tmp_path / "out")


def test_tied_lm_head_is_filled_from_the_embedding_when_the_base_stores_it(tiny, tmp_path):
    base = copy_tree(tiny.base("qwen3"), tmp_path / "base")
    embed = base_tensors(base)["model.embed_tokens.weight"]
    add_tensor_to_base(base, "lm_head.weight", embed)
    sd = {k: v for k, v in tiny.state_dict("qwen3").items() if k != "lm_head.weight"}
    model_pt = tm.save_consolidated(sd, tmp_path / "model.pt")
    result = convert_checkpoint(model_pt, base, tmp_path / "out")
    assert result.tied == {"lm_head.weight": "filled from model.embed_tokens.weight (tie_word_embeddings)"}
    out = base_tensors(tmp_path / "out")
    assert torch.equal(out["lm_head.weight"], sd["model.embed_tokens.weight"])


def test_untied_base_needs_its_lm_head(tiny, tmp_path):
    sd = {k: v for k, v in tiny.state_dict("qwen3_moe").items() if k != "lm_head.weight"}
    err = _refused(tiny, "qwen3_moe", sd, tmp_path)
    assert err.accounting.missing == ["lm_head.weight"]


def test_output_directory_must_be_empty(tiny, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(Refused, match="not empty"):
        convert_checkpoint(tiny.checkpoint("qwen3"), tiny.base("qwen3"), out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"model": {}}, "is not {'net': state_dict}"),
        ({"net": {}}, "'net' is not a non-empty dict"),
        ({"net": {"a": torch.zeros(1), "b": [1, 2]}}, "entry 'b' is a list, not a tensor"),
        ({"net": {"a": torch.zeros(1, dtype=torch.complex64)}}, "has no safetensors name"),
    ],
)
def test_malformed_checkpoint_is_refused_by_name(tiny, tmp_path, payload, fragment):
    path = tmp_path / "model.pt"
    torch.save(payload, path)
    with pytest.raises(InvalidRecord, match=fragment):
        convert_checkpoint(path, tiny.base("qwen3"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_checkpoint_that_is_not_a_torch_zip_is_refused(tiny, tmp_path):
    path = tmp_path / "model.pt"
    path.write_bytes(pickle.dumps({"net": {}}))
    with pytest.raises(InvalidRecord, match="cannot be memory-mapped") as err:
        convert_checkpoint(path, tiny.base("qwen3"), tmp_path / "out")
    assert str(path) in str(err.value)


def test_missing_checkpoint_is_not_found(tiny, tmp_path):
    with pytest.raises(NotFound):
        convert_checkpoint(tmp_path / "nope.pt", tiny.base("qwen3"), tmp_path / "out")


def test_base_without_weights_is_refused(tiny, tmp_path):
    base = copy_tree(tiny.base("qwen3"), tmp_path / "base")
    for p in base.glob("model*.safetensors*"):
        p.unlink()
    with pytest.raises(InvalidRecord, match=re.escape("neither model.safetensors.index.json nor model.safetensors")):
        convert_checkpoint(tiny.checkpoint("qwen3"), base, tmp_path / "out")


def test_base_index_that_disagrees_with_its_shards_is_refused(tiny, tmp_path):
    base = copy_tree(tiny.base("qwen3"), tmp_path / "base")
    index_path = base / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"]["model.ghost.weight"] = sorted(set(index["weight_map"].values()))[0]
    index_path.write_text(json.dumps(index))
    with pytest.raises(InvalidRecord, match=re.escape("listed but absent ['model.ghost.weight']")):
        convert_checkpoint(tiny.checkpoint("qwen3"), base, tmp_path / "out")
    assert not (tmp_path / "out").exists()
