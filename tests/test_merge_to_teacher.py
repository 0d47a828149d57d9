"""The whole offline path: experts → `merge` → `materialize` → a teacher transformers loads exactly."""

from __future__ import annotations

import pytest
import torch

from ckptflow.materialize import materialize
from ckptflow.merge.run import merge_experts
from helpers import tiny_models as tm


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen3", "qwen3_moe"])
def test_merged_model_materializes_and_loads_with_the_merged_weights(kind, tmp_path):
    base = tm.build_tiny_base(kind, tmp_path / "base")
    sd = tm.in_memory_state_dict(base)
    experts = []
    for i in range(3):
        path = tmp_path / f"expert{i}" / "model.pt"
        path.parent.mkdir()
        experts.append(tm.save_consolidated(tm.perturbed(sd, 0.01, seed=i), path))
    out = tmp_path / "run" / "checkpoint_artifacts" / "iter_000300" / "model.pt"
    merged = merge_experts("tv", experts, out, base=base, lam=0.5, progress=False)
    assert merged.status == "built"

    teacher = tmp_path / "teacher"
    result = materialize(base=base, out=teacher, ckpt_dir=out.parent, min_tensors=1, progress=False)
    assert result.status == "built"

    with tm.quiet_transformers():
        model, info = tm.auto_class(kind).from_pretrained(teacher, output_loading_info=True, dtype=torch.bfloat16)
    assert all(not v for v in info.values()), info
    merged_sd = torch.load(out, mmap=True, weights_only=True)["net"]
    reference = tm.load_direct(kind, base, merged_sd)
    ids = tm.sample_input_ids()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
