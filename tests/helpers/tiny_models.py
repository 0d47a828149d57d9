"""Tiny real Hugging Face base directories, built offline from config, for tests across ckptflow.

Stable API (other test packages import it; change only by adding):

``KINDS``
    The kinds a builder exists for: ``"qwen3"`` (dense, tied embeddings), ``"qwen3_moe"`` (experts fused in
    memory, per-expert on disk, ``2·moe_intermediate_size != hidden_size`` so a transpose shows),
    ``"qwen2_5_vl"`` (VLM: legacy ``model.layers.*`` / ``visual.*`` names on disk, ``model.language_model.*``
    in memory), ``"qwen3_5"`` (VLM with hybrid linear attention, same names on disk and in memory),
    ``"qwen3_5_moe"`` (its MoE sibling: ``model.language_model.*`` experts per-expert on disk, fused in
    memory, plus a shared expert) and ``"qwen3_vl_moe"`` (VLM whose experts are fused on disk too, as
    ``save_pretrained`` writes them, ``(E, 2I, H)``; see ``transpose_fused_experts`` for the Hub's form).
    ``VLM_KINDS`` is the subset with a vision tower and an image processor.
``build_tiny_base(kind, out_dir, *, seed=0, overrides=None) -> Path``
    Writes a complete base into ``out_dir`` (created; must not exist or be empty) and returns it:
    ``config.json``, bf16 random-init weights saved with ``save_pretrained(max_shard_size="100KB")``
    (several ``model-0000K-of-0000N.safetensors`` + ``model.safetensors.index.json``), a byte-level BPE
    tokenizer trained with ``tokenizers`` (``tokenizer.json``, ``tokenizer_config.json``,
    ``chat_template.jinja`` with a ``<think>`` branch), ``generation_config.json``; VLMs also get
    ``preprocessor_config.json`` (``Qwen2VLImageProcessorPil``, needs pillow to load), ``chat_template.json``
    and ``additional_chat_templates/tool_use.jinja``. ``overrides`` updates the (text) config's sizes, e.g.
    ``{"hidden_size": 512, "num_hidden_layers": 8}`` for a larger input; the tokenizer stays tiny.
    Deterministic for a given ``(kind, seed, overrides)``. Takes about a second.
``transpose_fused_experts(base_dir) -> list[str]``
    Rewrites a base's fused expert tensors in place into the transposed hub form (``gate_up_proj``
    ``(E, H, 2I)``, ``down_proj`` ``(E, I, H)``), as Qwen3-VL-MoE checkpoints on the Hub store them
    (transformers 5.24's own ``save_pretrained`` writes ``(E, 2I, H)``; its loader accepts both). Returns
    the keys it transposed.
``model_class(kind)``
    The transformers class that loads the base (``Qwen3ForCausalLM``, ``Qwen2_5_VLForConditionalGeneration`` …).
``auto_class(kind)``
    ``AutoModelForCausalLM`` for text kinds, ``AutoModelForImageTextToText`` for VLMs.
``in_memory_state_dict(base_dir) -> dict[str, torch.Tensor]``
    The base's weights in the transformers-v5 in-memory layout (fused experts, ``model.language_model.*``),
    exactly as ``model.state_dict()`` gives them: a tied ``lm_head.weight`` shares storage with the embedding.
``save_consolidated(state_dict, path) -> Path``
    ``torch.save({"net": state_dict}, path)``: the consolidated ``model.pt`` a trainer or merge writes.
``perturbed(state_dict, scale, seed) -> dict``
    Every tensor plus seeded noise (same dtype and shape), tensors sharing storage stay shared, so the
    result differs from the base everywhere and a conversion that copied the base would be caught.
``load_direct(kind, base_dir, state_dict)``
    The model built from the base's ``config.json`` with ``state_dict`` loaded strictly: "the same weights
    loaded directly", the reference the loader tests compare logits against.
``sample_input_ids(vocab_size=..., seed=0)``
    A fixed ``(2, 12)`` batch of ordinary (non-special) token ids below the tiny vocabulary size.
``make_config(kind, overrides=None)``, ``build_tokenizer(out_dir, *, seed=0, vlm=False)``
    The pieces ``build_tiny_base`` is made of, for tests that need only a config or only a tokenizer.
``VOCAB_SIZE``, ``SPECIAL_TOKENS``, ``TOKEN_ID``, ``PAD_ID``, ``EOS_ID``, ``CHAT_TEMPLATE``
    The tokenizer's constants: special tokens take ids 0… in ``SPECIAL_TOKENS`` order.
``quiet_transformers()``
    Context manager hiding transformers' progress bars.

Warnings: none are silenced. transformers 5.24 raises no warning while building, saving, loading or running
these models; ``quiet_transformers()`` only hides its progress bars.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

KINDS = ("qwen3", "qwen3_moe", "qwen2_5_vl", "qwen3_5", "qwen3_5_moe", "qwen3_vl_moe")
VLM_KINDS = frozenset({"qwen2_5_vl", "qwen3_5", "qwen3_5_moe", "qwen3_vl_moe"})

VOCAB_SIZE = 512
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
# The BPE trainer gives special tokens the first ids, in this order.
TOKEN_ID = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
PAD_ID = TOKEN_ID["<|endoftext|>"]
EOS_ID = TOKEN_ID["<|im_end|>"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    "{{- '<think>\\n' + message['reasoning_content'] | trim + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)
TOOL_TEMPLATE = "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n' }}{%- endif %}" + CHAT_TEMPLATE

_CORPUS_WORDS = (
    "the model reads a checkpoint and writes shards so that a teacher can load weights offline "
    "experts route tokens through gate up and down projections while attention mixes positions "
    "a vision tower encodes image patches into the language model hidden states before decoding "
    "think step by step then answer with the final result and close the turn cleanly "
    "numbers 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 32 64 128 256 512 1024 2048 4096 8192"
).split()

@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Hide transformers' progress bars ("Writing model shards", "Loading weights") inside this block.

    Warnings are not silenced: transformers 5.24 raises none while building, saving, loading or running
    these models, so pytest's ``filterwarnings = error`` keeps guarding them too.
    """
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


def _text_sizes(kind: str) -> dict[str, Any]:
    common = {
        "vocab_size": VOCAB_SIZE,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "bos_token_id": None,
        "eos_token_id": EOS_ID,
        "pad_token_id": PAD_ID,
    }
    if kind == "qwen3":
        return {**common, "head_dim": 16, "tie_word_embeddings": True}
    if kind == "qwen3_moe":
        # 2 * moe_intermediate_size (96) != hidden_size (64): a transposed expert is visible in its shape.
        return {
            **common,
            "head_dim": 16,
            "moe_intermediate_size": 48,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "tie_word_embeddings": False,
        }
    if kind == "qwen2_5_vl":
        # head_dim 64 / 4 = 16: mrope_section must sum to head_dim / 2 = 8.
        return {**common, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
    if kind == "qwen3_vl_moe":
        # head_dim 16: mrope_section sums to 8; experts fused and transposed on disk.
        return {
            **common,
            "head_dim": 16,
            "moe_intermediate_size": 48,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2], "mrope_interleaved": True,
            },
        }
    if kind == "qwen3_5_moe":
        text = {k: v for k, v in _text_sizes("qwen3_5").items() if k != "intermediate_size"}
        return {
            **text,
            "moe_intermediate_size": 48,
            "shared_expert_intermediate_size": 32,
            "num_experts": 4,
            "num_experts_per_tok": 2,
        }
    if kind == "qwen3_5":
        # head_dim 32 with partial_rotary_factor 0.25: rotary_dim 8, mrope_section sums to 4.
        return {
            **common,
            "num_hidden_layers": 4,  # three linear-attention layers, one full-attention layer
            "head_dim": 32,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": 0.25,
                "mrope_section": [2, 1, 1],
                "mrope_interleaved": True,
            },
        }
    raise ValueError(f"unknown tiny model kind {kind!r}; choose one of {KINDS}")


def _vision_sizes(kind: str, out_hidden: int) -> dict[str, Any]:
    if kind == "qwen2_5_vl":
        return {
            "depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": out_hidden,
            "fullatt_block_indexes": [1], "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
        }
    vision = {
        "depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": out_hidden,
        "num_position_embeddings": 64, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    }
    if kind == "qwen3_vl_moe":
        vision["deepstack_visual_indexes"] = [1]
    return vision


def make_config(kind: str, overrides: dict[str, Any] | None = None):
    """The transformers config object for ``kind`` (sizes of the text model updated by ``overrides``)."""
    import transformers as tf

    text = {**_text_sizes(kind), **(overrides or {})}
    if kind == "qwen3":
        return tf.Qwen3Config(**text)
    if kind == "qwen3_moe":
        return tf.Qwen3MoeConfig(**text)
    vlm_ids = {
        "image_token_id": TOKEN_ID["<|image_pad|>"],
        "video_token_id": TOKEN_ID["<|video_pad|>"],
        "vision_start_token_id": TOKEN_ID["<|vision_start|>"],
        "vision_end_token_id": TOKEN_ID["<|vision_end|>"],
    }
    vision = _vision_sizes(kind, text["hidden_size"])
    if kind == "qwen2_5_vl":
        return tf.Qwen2_5_VLConfig(text_config=text, vision_config=vision, **vlm_ids)
    if kind == "qwen3_5":
        return tf.Qwen3_5Config(text_config=text, vision_config=vision, **vlm_ids)
    if kind == "qwen3_5_moe":
        return tf.Qwen3_5MoeConfig(text_config=text, vision_config=vision, **vlm_ids)
    if kind == "qwen3_vl_moe":
        return tf.Qwen3VLMoeConfig(text_config=text, vision_config=vision, **vlm_ids)
    raise ValueError(f"unknown tiny model kind {kind!r}; choose one of {KINDS}")


def model_class(kind: str):
    import transformers as tf

    return {
        "qwen3": tf.Qwen3ForCausalLM,
        "qwen3_moe": tf.Qwen3MoeForCausalLM,
        "qwen2_5_vl": tf.Qwen2_5_VLForConditionalGeneration,
        "qwen3_5": tf.Qwen3_5ForConditionalGeneration,
        "qwen3_5_moe": tf.Qwen3_5MoeForConditionalGeneration,
        "qwen3_vl_moe": tf.Qwen3VLMoeForConditionalGeneration,
    }[kind]


def auto_class(kind: str):
    import transformers as tf

    return tf.AutoModelForImageTextToText if kind in VLM_KINDS else tf.AutoModelForCausalLM


def _corpus(seed: int) -> list[str]:
    import random

    rng = random.Random(seed)
    lines = []
    for _ in range(400):
        words = [rng.choice(_CORPUS_WORDS) for _ in range(rng.randint(6, 18))]
        lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ","]))
    return lines


def build_tokenizer(out_dir: Path, *, seed: int = 0, vlm: bool = False):
    """Train a byte-level BPE offline, wrap it, save it (tokenizer.json, tokenizer_config.json, templates)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        model_max_length=256,
    )
    fast.chat_template = {"default": CHAT_TEMPLATE, "tool_use": TOOL_TEMPLATE} if vlm else CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_tiny_base(kind: str, out_dir: Path, *, seed: int = 0, overrides: dict[str, Any] | None = None) -> Path:
    """Write a complete tiny base of ``kind`` into ``out_dir`` and return ``out_dir`` (see the module doc)."""
    from transformers import GenerationConfig

    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise FileExistsError(f"{out_dir} is not empty")
    out_dir.mkdir(parents=True, exist_ok=True)
    config = make_config(kind, overrides)
    with quiet_transformers():
        torch.manual_seed(seed)
        model = model_class(kind)(config).to(torch.bfloat16)
        model.save_pretrained(out_dir, max_shard_size="100KB")
        del model
        build_tokenizer(out_dir, seed=seed, vlm=kind in VLM_KINDS)
        GenerationConfig(
            eos_token_id=[EOS_ID, PAD_ID], pad_token_id=PAD_ID, do_sample=True, temperature=0.6, top_p=0.95, top_k=20
        ).save_pretrained(out_dir)
        if kind in VLM_KINDS:
            _write_processor_files(kind, out_dir)
    return out_dir


def _write_processor_files(kind: str, out_dir: Path) -> None:
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    patch = 14 if kind == "qwen2_5_vl" else 16
    proc = Qwen2VLImageProcessorPil(
        patch_size=patch, temporal_patch_size=2, merge_size=2,
        size={"shortest_edge": 4 * patch * patch, "longest_edge": 64 * patch * patch},
    )
    proc.save_pretrained(out_dir)
    # What a Qwen-VL processor writes beside its image processor; AutoProcessor needs torchvision to write it.
    (out_dir / "chat_template.json").write_text(
        json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )


def transpose_fused_experts(base_dir: Path) -> list[str]:
    """Rewrite fused experts of ``base_dir`` in the transposed hub form (see the module doc)."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    base_dir = Path(base_dir)
    index = json.loads((base_dir / "model.safetensors.index.json").read_text(encoding="utf-8"))
    done = []
    for shard in sorted(set(index["weight_map"].values())):
        path = base_dir / shard
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        fused = [k for k in tensors if k.endswith((".experts.gate_up_proj", ".experts.down_proj"))]
        if not fused:
            continue
        for k in fused:
            tensors[k] = tensors[k].transpose(1, 2).contiguous()
        save_file(tensors, str(path), metadata=metadata)
        done.extend(fused)
    return sorted(done)


def in_memory_state_dict(base_dir: Path) -> dict[str, torch.Tensor]:
    """Load the base with transformers and return ``state_dict()`` (v5 in-memory layout, ties kept shared)."""
    import transformers as tf

    config = tf.AutoConfig.from_pretrained(base_dir)
    cls = getattr(tf, config.architectures[0])
    with quiet_transformers():
        model = cls.from_pretrained(base_dir, dtype=torch.bfloat16)
    return {k: v.detach() for k, v in model.state_dict().items()}


def save_consolidated(state_dict: dict[str, torch.Tensor], path: Path) -> Path:
    """Write the consolidated checkpoint ``{"net": state_dict}`` with ``torch.save``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"net": state_dict}, path)
    return path


def perturbed(state_dict: dict[str, torch.Tensor], scale: float, seed: int) -> dict[str, torch.Tensor]:
    """``t + scale * noise`` for every tensor (same dtype), keeping tensors that shared storage shared."""
    gen = torch.Generator().manual_seed(seed)
    done: dict[tuple[int, tuple[int, ...], tuple[int, ...]], torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for key in sorted(state_dict):
        t = state_dict[key]
        ident = (t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size(), tuple(t.shape), t.stride())
        if ident not in done:
            if t.is_floating_point():
                noise = torch.randn(t.shape, generator=gen, dtype=torch.float32)
                done[ident] = (t.float() + scale * noise).to(t.dtype)
            else:
                done[ident] = t.clone()
        out[key] = done[ident]
    return out


def load_direct(kind: str, base_dir: Path, state_dict: dict[str, torch.Tensor]):
    """The base's architecture built from its ``config.json`` with ``state_dict`` loaded strictly, in eval mode."""
    import transformers as tf

    config = tf.AutoConfig.from_pretrained(base_dir)
    with quiet_transformers():
        model = model_class(kind)._from_config(config, dtype=torch.bfloat16)
        model.load_state_dict(state_dict, strict=True)
    return model.eval()


def sample_input_ids(vocab_size: int = VOCAB_SIZE, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # Stay clear of the special ids so no image/video placeholder token appears in a text-only batch.
    return torch.randint(len(SPECIAL_TOKENS), vocab_size, (2, 12), generator=gen)
