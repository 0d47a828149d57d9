"""The merged tensors are bit-identical to fp32 oracles (``merge_helpers``), whatever layout the inputs use."""

from __future__ import annotations

import pytest
import torch
from merge_helpers import assert_bits_equal, avg_oracle, load_net, to_disk_layout, tv_oracle

from ckptflow.merge import merge_experts
from helpers.tiny_models import (
    build_tiny_base,
    in_memory_state_dict,
    load_direct,
    perturbed,
    sample_input_ids,
    save_consolidated,
    transpose_fused_experts,
)


@pytest.mark.parametrize("layout", ["mem", "disk"])
def test_avg_is_bit_identical_to_fp32_sum_divided_then_cast(moe, out, layout):
    result = merge_experts("avg", moe.paths(layout), out, progress=False)
    assert result.status == "built"
    experts = moe.mem if layout == "mem" else moe.disk
    assert_bits_equal(load_net(out), avg_oracle(experts))


@pytest.mark.parametrize("lam", [1.0, 0.7])
def test_tv_is_bit_identical_to_fp32_base_plus_scaled_delta_sum_cast_once(moe, out, lam):
    merge_experts("tv", moe.paths("mem"), out, base=moe.base, lam=lam, progress=False)
    # The base is read from its safetensors shards (per-expert names) and mapped to the experts' layout.
    assert_bits_equal(load_net(out), tv_oracle(moe.base_mem, moe.mem, lam))


def test_tv_onto_a_tied_base_uses_the_embedding_for_lm_head(dense, out):
    assert "lm_head.weight" in dense.mem[0]
    merge_experts("tv", dense.paths("mem"), out, base=dense.base, lam=0.5, progress=False)
    assert_bits_equal(load_net(out), tv_oracle(dense.base_mem, dense.mem, 0.5))


def test_experts_in_different_layouts_are_normalised_before_arithmetic(moe, out):
    mixed = [moe.mem_paths[0], moe.disk_paths[1], moe.mem_paths[2]]
    result = merge_experts("avg", mixed, out, progress=False)
    assert result.inputs_normalised
    # Output in the first expert's (fused) layout, values exactly the oracle's.
    assert_bits_equal(load_net(out), avg_oracle(moe.mem))


def test_output_keeps_the_first_experts_layout(moe, out):
    mixed = [moe.disk_paths[0], moe.mem_paths[1], moe.mem_paths[2]]
    result = merge_experts("tv", mixed, out, base=moe.base, progress=False)
    assert result.layout.startswith("per-expert")
    assert_bits_equal(load_net(out), to_disk_layout(tv_oracle(moe.base_mem, moe.mem, 1.0)))


def test_tied_weights_stay_tied_in_the_output(dense, out):
    merge_experts("avg", dense.paths("mem"), out, progress=False)
    net = torch.load(out, map_location="cpu", mmap=True, weights_only=True)["net"]
    assert net["lm_head.weight"].untyped_storage().data_ptr() == net["model.embed_tokens.weight"].untyped_storage().data_ptr()


def test_merged_model_loads_strictly_into_transformers_and_runs(moe, out):
    merge_experts("tv", moe.paths("mem"), out, base=moe.base, lam=0.5, progress=False)
    model = load_direct("qwen3_moe", moe.base, load_net(out))  # strict load_state_dict
    with torch.no_grad():
        logits = model(sample_input_ids()).logits
    assert torch.isfinite(logits).all()


def test_model_pt_loads_with_weights_only_and_mmap(moe, out):
    merge_experts("avg", moe.paths("mem"), out, progress=False)
    obj = torch.load(out, map_location="cpu", mmap=True, weights_only=True)
    assert list(obj) == ["net"]
    assert all(t.dtype == torch.bfloat16 for t in obj["net"].values())


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "qwen3_vl_moe"])
def test_tv_onto_a_vlm_base_maps_its_on_disk_names_and_expert_forms(tmp_path, out, kind):
    # The base's shards use the on-disk names (legacy ``model.layers.*``/``visual.*`` or fused experts in
    # the Hub's transposed form); the experts are v5 in-memory state dicts. One layout engine maps both.
    base = build_tiny_base(kind, tmp_path / "base")
    base_mem = in_memory_state_dict(base)
    if kind == "qwen3_vl_moe":
        assert transpose_fused_experts(base)
    mem = [perturbed(base_mem, 0.02, seed=i + 1) for i in range(2)]
    paths = [save_consolidated(sd, tmp_path / f"e{i}" / "model.pt") for i, sd in enumerate(mem)]
    result = merge_experts("tv", paths, out, base=base, lam=0.5, progress=False)
    assert result.inputs_normalised
    assert_bits_equal(load_net(out), tv_oracle(base_mem, mem, 0.5))
