"""Layout mapping: names, fused/per-expert/transposed experts, both directions, checked against transformers."""

from __future__ import annotations

import pytest
import torch
from conversion_helpers import ALL_KINDS, HUB, MOE_KINDS, assert_same_tensors, base_tensors

from ckptflow.conversion.hf import convert_checkpoint
from ckptflow.conversion.layout import KeyMapper, TensorInfo, describe, to_in_memory, to_on_disk
from ckptflow.errors import InvalidRecord
from helpers import tiny_models as tm


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_in_memory_weights_of_the_base_convert_back_to_the_base_bitwise(tiny, kind, tmp_path):
    # transformers loaded the base (renaming, fusing, maybe transposing); converting its state_dict back
    # must give exactly the base's on-disk tensors, in the base's layout.
    base = tiny.base(kind)
    model_pt = tm.save_consolidated(tm.in_memory_state_dict(base), tmp_path / "model.pt")
    result = convert_checkpoint(model_pt, base, tmp_path / "out", max_shard_bytes=50_000)
    assert_same_tensors(base_tensors(tmp_path / "out"), base_tensors(base))
    expected_target = {
        "qwen3_moe": "experts per-expert",
        "qwen3_5_moe": "experts per-expert",
        "qwen3_vl_moe": "experts fused (E, 2I, H)",
        HUB: "experts fused transposed (E, H, 2I)",
    }.get(kind, "dense")
    assert result.target_layout == expected_target


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_to_in_memory_of_the_on_disk_tensors_equals_what_transformers_loads(tiny, kind):
    base = tiny.base(kind)
    mapper = KeyMapper.for_base(base)
    assert mapper.source.startswith("transformers:")
    got = to_in_memory(base_tensors(base), mapper, what="base")
    assert_same_tensors(got, tm.in_memory_state_dict(base))
    if kind == "qwen3":
        assert got["lm_head.weight"] is got["model.embed_tokens.weight"]  # tied: filled, shared like state_dict()


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_to_on_disk_of_the_in_memory_weights_equals_the_base(tiny, kind):
    base = tiny.base(kind)
    mapper = KeyMapper.for_base(base)
    on_disk = base_tensors(base)
    got = to_on_disk(tm.in_memory_state_dict(base), {k: TensorInfo.of(v) for k, v in on_disk.items()}, mapper)
    assert_same_tensors(got, on_disk)


def _moe_forms(state_dict: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """The same qwen3_moe weights as fused (E, 2I, H), transposed hub (E, H, 2I) and per-expert keys."""
    fused = dict(state_dict)
    transposed = {k: (v.transpose(1, 2).contiguous() if ".experts." in k else v) for k, v in fused.items()}
    per_expert: dict[str, torch.Tensor] = {}
    for key, value in fused.items():
        if key.endswith(".experts.gate_up_proj"):
            prefix, inter = key.removesuffix(".gate_up_proj"), value.shape[1] // 2
            for e in range(value.shape[0]):
                per_expert[f"{prefix}.{e}.gate_proj.weight"] = value[e, :inter].clone()
                per_expert[f"{prefix}.{e}.up_proj.weight"] = value[e, inter:].clone()
        elif key.endswith(".experts.down_proj"):
            prefix = key.removesuffix(".down_proj")
            for e in range(value.shape[0]):
                per_expert[f"{prefix}.{e}.down_proj.weight"] = value[e].clone()
        else:
            per_expert[key] = value
    return {"fused": fused, "transposed": transposed, "per_expert": per_expert}


@pytest.mark.parametrize("form", ["fused", "transposed", "per_expert"])
@pytest.mark.parametrize("kind", MOE_KINDS)
def test_every_expert_form_of_the_checkpoint_gives_the_same_export(tiny, kind, form, tmp_path):
    forms = _moe_forms(tiny.state_dict(kind))
    assert forms["transposed"].keys() == forms["fused"].keys()
    model_pt = tm.save_consolidated(forms[form], tmp_path / "model.pt")
    convert_checkpoint(model_pt, tiny.base(kind), tmp_path / "out")
    assert_same_tensors(base_tensors(tmp_path / "out"), base_tensors(tiny.export(kind)))


def test_on_disk_vlm_names_in_the_checkpoint_convert_like_in_memory_names(tiny, tmp_path):
    # qwen2_5_vl: legacy model.layers.* / visual.* on disk, model.language_model.* / model.visual.* in memory.
    kind = "qwen2_5_vl"
    base = tiny.base(kind)
    mapper = KeyMapper.for_base(base)
    on_disk_infos = {k: TensorInfo.of(v) for k, v in base_tensors(base).items()}
    assert any(k.startswith("visual.") for k in on_disk_infos)
    on_disk = to_on_disk(tiny.state_dict(kind), on_disk_infos, mapper)
    model_pt = tm.save_consolidated(on_disk, tmp_path / "model.pt")
    convert_checkpoint(model_pt, base, tmp_path / "out")
    assert_same_tensors(base_tensors(tmp_path / "out"), base_tensors(tiny.export(kind)))


def test_transposed_and_in_memory_orientation_are_told_apart_by_shape():
    mapper = KeyMapper.identity()
    e, i, h = 4, 48, 64
    fused = describe(
        {"m.experts.gate_up_proj": TensorInfo((e, 2 * i, h), "BF16"), "m.experts.down_proj": TensorInfo((e, h, i), "BF16")},
        mapper, what="t",
    )
    hub = describe(
        {"m.experts.gate_up_proj": TensorInfo((e, h, 2 * i), "BF16"), "m.experts.down_proj": TensorInfo((e, i, h), "BF16")},
        mapper, what="t",
    )
    assert not fused["m.experts.gate_up_proj"].transposed and hub["m.experts.gate_up_proj"].transposed
    assert (hub["m.experts.down_proj"].inter, hub["m.experts.down_proj"].hidden) == (i, h)
    # Even when 2I == H the pair is unambiguous: down_proj (E, H, I) vs (E, I, H) differ.
    square = describe(
        {"m.experts.gate_up_proj": TensorInfo((e, 64, 64), "BF16"), "m.experts.down_proj": TensorInfo((e, 32, 64), "BF16")},
        mapper, what="t",
    )
    assert square["m.experts.gate_up_proj"].transposed


def test_expert_slices_of_the_transposed_form_are_the_linear_weights():
    mapper = KeyMapper.identity()
    e, i, h = 3, 5, 7
    gate, up, down = torch.randn(e, i, h), torch.randn(e, i, h), torch.randn(e, h, i)
    hub = {
        "m.experts.gate_up_proj": torch.cat([gate, up], dim=1).transpose(1, 2).contiguous(),
        "m.experts.down_proj": down.transpose(1, 2).contiguous(),
    }
    targets = {f"m.experts.{x}.{p}.weight": TensorInfo((h, i) if p == "down_proj" else (i, h), "F32")
               for x in range(e) for p in ("gate_proj", "up_proj", "down_proj")}
    got = to_on_disk(hub, targets, mapper)
    for x in range(e):
        assert torch.equal(got[f"m.experts.{x}.gate_proj.weight"], gate[x])
        assert torch.equal(got[f"m.experts.{x}.up_proj.weight"], up[x])
        assert torch.equal(got[f"m.experts.{x}.down_proj.weight"], down[x])


@pytest.mark.parametrize(
    ("infos", "fragment"),
    [
        ({"m.experts.gate_up_proj": TensorInfo((4, 96, 64), "BF16")}, "no fused down_proj"),
        ({"m.experts.down_proj": TensorInfo((4, 64, 48), "BF16")}, "no fused gate_up_proj"),
        (
            {"m.experts.gate_up_proj": TensorInfo((4, 96, 64), "BF16"), "m.experts.down_proj": TensorInfo((4, 64, 40), "BF16")},
            "neither",
        ),
        (
            {"m.experts.gate_up_proj": TensorInfo((4, 96), "BF16"), "m.experts.down_proj": TensorInfo((4, 64, 48), "BF16")},
            "shapes gate_up",
        ),
    ],
)
def test_malformed_fused_experts_are_refused_by_name(infos, fragment):
    with pytest.raises(InvalidRecord, match=fragment) as err:
        describe(infos, KeyMapper.identity(), what="checkpoint x.pt")
    assert "checkpoint x.pt" in str(err.value) and "m.experts" in str(err.value)
