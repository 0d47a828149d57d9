"""The export loads with transformers offline, completely, and computes exactly what the checkpoint computes."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conversion_helpers import ALL_KINDS, model_kind
from transformers import AutoTokenizer, GenerationConfig

from ckptflow.conversion.sidecars import load_with_transformers
from helpers import tiny_models as tm


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_export_loads_completely_and_logits_equal_the_checkpoint(tiny, kind):
    export = tiny.export(kind)
    with tm.quiet_transformers():
        model, info = tm.auto_class(model_kind(kind)).from_pretrained(
            export, output_loading_info=True, dtype=torch.bfloat16
        )
    assert {name: sorted(v) for name, v in info.items() if v} == {}
    direct = tm.load_direct(model_kind(kind), tiny.base(kind), tiny.state_dict(kind))
    ids = tm.sample_input_ids()
    with torch.no_grad(), tm.quiet_transformers():
        got = model.eval()(input_ids=ids).logits
        want = direct(input_ids=ids).logits
    assert torch.equal(got, want), f"max |Δ| = {(got.float() - want.float()).abs().max().item()}"


@pytest.mark.parametrize("kind", tm.KINDS)
def test_export_differs_from_the_base_it_was_shaped_on(tiny, kind):
    # The checkpoint is perturbed: equal logits above are not the base's weights passing through.
    with tm.quiet_transformers():
        base_model = tm.auto_class(kind).from_pretrained(tiny.base(kind), dtype=torch.bfloat16)
        export_model = tm.auto_class(kind).from_pretrained(tiny.export(kind), dtype=torch.bfloat16)
    ids = tm.sample_input_ids()
    with torch.no_grad(), tm.quiet_transformers():
        assert not torch.equal(base_model.eval()(input_ids=ids).logits, export_model.eval()(input_ids=ids).logits)


@pytest.mark.parametrize("kind", tm.KINDS)
def test_sidecars_load_with_the_teacher_loaders(tiny, kind):
    export = tiny.export(kind)
    tok = AutoTokenizer.from_pretrained(export)
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert GenerationConfig.from_pretrained(export).eos_token_id == [tm.EOS_ID, tm.PAD_ID]
    if kind in tm.VLM_KINDS:
        pytest.importorskip("PIL", reason="AutoImageProcessor of a Qwen-VL base needs pillow or torchvision")
    report = load_with_transformers(export)
    assert report["AutoTokenizer"] == report["GenerationConfig"] == "ok"
    if kind in tm.VLM_KINDS:
        # Imported here, not at the top: it costs every pytest worker about 3 CPU-s at collection (the
        # processor stack of transformers), and only the worker that runs this case needs it.
        from transformers import AutoImageProcessor

        assert type(AutoImageProcessor.from_pretrained(export)).__name__.startswith("Qwen2VLImageProcessor")
        assert report["AutoImageProcessor"] == "ok"
        assert report["AutoProcessor"].startswith("ok" if importlib.util.find_spec("torchvision") else "skipped")
