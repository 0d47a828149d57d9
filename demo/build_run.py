"""Build the demo's training run offline: a tiny Qwen3-MoE base, three experts, one trainer artifact.

    python demo/build_run.py [--base-only] ROOT

writes, under ROOT (which must not exist or be empty; with ``--base-only``, ``base/`` alone: an offline
causal LM for ``examples/train_hf_trainer.py``, in about half the time):

- ``base/``: a complete Hugging Face Qwen3-MoE directory: ``config.json`` (a real ``Qwen3MoeConfig``,
  scaled down), bf16 weights in several safetensors shards with their index, a byte-level BPE tokenizer
  trained here on a small corpus (``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``)
  and ``generation_config.json``. The weights are trained for a few hundred steps on the corpus, so a
  greedy generation from a model merged onto this base reads as words, not noise.
- ``runs/demo/experts/{storage,transfer,modeling}/<ts>/checkpoint_artifacts/iter_000200/model.pt``: three
  experts derived from the base, each fine-tuned on its own slice of the corpus and saved the way a trainer
  consolidates one (``torch.save({"net": state_dict})``, bf16, the transformers in-memory layout).
- ``runs/demo/sft/trainer/<ts>/checkpoint_artifacts/iter_000100/``: ``model.pt`` and ``optim/``, the
  optimizer state written with ``torch.distributed.checkpoint`` (a DCP directory: ``.metadata`` and
  ``__0_0.distcp``), as a training loop saves it.

Nothing is sealed here: ``demo/demo.sh`` seals each directory with ``ckptflow seal``. Prints one JSON
object (the paths) on stdout. Deterministic for a given ROOT layout; about 8 CPU-s, on one torch thread.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

import torch

TS = "20261129T000000Z"
EXPERT_ITER = 200
TRAINER_ITER = 100
VOCAB_SIZE = 768
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
PAD_ID, EOS_ID = 0, 2  # the BPE trainer gives special tokens the first ids, in this order

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

# What the experts specialise in: each one is fine-tuned on its own slice; the base sees all of them.
CORPUS = {
    "storage": [
        "a committed artifact is published to the archive and its receipt is written last.",
        "publication declares every object first, uploads the payloads, then commits the manifest.",
        "the archive refuses a second create of the same key, so two publishers never overwrite.",
        "a receipt names the archive that holds the payloads of the artifact.",
    ],
    "transfer": [
        "fetch brings the artifact back and checks every file against the declaration.",
        "a staged copy carries its ownership record beside the files it fetched.",
        "the payloads were pruned, so the teacher is built from the archive.",
        "verify reads the archived objects and compares their digests with the receipt.",
    ],
    "modeling": [
        "the merged teacher is the base plus the sum of the expert task vectors.",
        "merge streams one tensor at a time in fp32 and casts the result once.",
        "the teacher directory holds safetensors shards, the index and the tokenizer.",
        "experts route tokens through gate up and down projections.",
    ],
}
PROMPT = "the merged teacher"


def sizes() -> dict:
    # A Qwen3-MoE decoder scaled down: 8 experts, 2 per token, 2·moe_intermediate_size != hidden_size.
    return {
        "vocab_size": VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_experts": 4, "num_experts_per_tok": 2, "decoder_sparse_step": 1, "max_position_embeddings": 512,
        "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
    }


def build_tokenizer(out_dir: Path):
    """Train a byte-level BPE on the corpus, wrap it for transformers and save it into ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    lines = [line for group in CORPUS.values() for line in group]
    tok.train_from_iterator(lines * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=SPECIAL_TOKENS[1:], model_max_length=512)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def batches(tokenizer, lines: list[str], steps: int, seed: int):
    """``steps`` batches of 8 corpus lines, each ending with the end-of-turn token, padded to one length."""
    rng = random.Random(seed)
    encoded = [tokenizer(line)["input_ids"] + [EOS_ID] for line in lines]
    for _ in range(steps):
        picked = [rng.choice(encoded) for _ in range(8)]
        width = max(len(ids) for ids in picked)
        ids = torch.tensor([ids + [PAD_ID] * (width - len(ids)) for ids in picked])
        labels = ids.masked_fill(ids == PAD_ID, -100)
        yield ids, labels


def train(model, tokenizer, lines: list[str], steps: int, lr: float, seed: int):
    """A few AdamW steps of next-token prediction in fp32; returns the optimizer."""
    torch.manual_seed(seed)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for ids, labels in batches(tokenizer, lines, steps, seed):
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    return opt, loss.item()


def save_consolidated(model, path: Path) -> Path:
    """``torch.save({"net": state_dict})`` in bf16: the consolidated ``model.pt`` a trainer writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    torch.save({"net": state}, path)
    return path


def save_dcp_optimizer(opt, out_dir: Path) -> Path:
    """The optimizer state as a DCP directory (``.metadata`` + ``__0_0.distcp``), one process, no group."""
    import torch.distributed.checkpoint as dcp

    dcp.save({"optim": opt.state_dict()}, checkpoint_id=str(out_dir))
    return out_dir


def artifact_dir(root: Path, run: str, iteration: int) -> Path:
    return root / "runs" / run / TS / "checkpoint_artifacts" / f"iter_{iteration:06d}"


def build(root: Path, *, base_only: bool = False) -> dict:
    import transformers as tf
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    base = root / "base"
    base.mkdir(parents=True)
    tokenizer = build_tokenizer(base)
    torch.manual_seed(0)
    model = tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(**sizes()))
    all_lines = [line for group in CORPUS.values() for line in group]
    _, base_loss = train(model, tokenizer, all_lines, steps=60, lr=1e-2, seed=0)
    model.to(torch.bfloat16).save_pretrained(base, max_shard_size="100KB")
    tf.GenerationConfig(eos_token_id=[EOS_ID, PAD_ID], pad_token_id=PAD_ID, do_sample=True, temperature=0.6,
                        top_p=0.95, top_k=20).save_pretrained(base)
    out = {"base": str(base), "base_loss": round(base_loss, 3), "experts": {}, "prompt": PROMPT}
    if base_only:
        return out
    for seed, (name, lines) in enumerate(CORPUS.items(), start=1):
        expert = tf.Qwen3MoeForCausalLM.from_pretrained(base, dtype=torch.float32)
        _, loss = train(expert, tokenizer, lines, steps=15, lr=2e-3, seed=seed)
        path = save_consolidated(expert, artifact_dir(root, f"demo/experts/{name}", EXPERT_ITER) / "model.pt")
        out["experts"][name] = {"model": str(path), "loss": round(loss, 3)}
    trainer = tf.Qwen3MoeForCausalLM.from_pretrained(base, dtype=torch.float32)
    opt, loss = train(trainer, tokenizer, all_lines, steps=5, lr=1e-3, seed=9)
    art = artifact_dir(root, "demo/sft/trainer", TRAINER_ITER)
    save_consolidated(trainer, art / "model.pt")
    save_dcp_optimizer(opt, art / "optim")
    out["trainer"] = {"artifact_dir": str(art), "loss": round(loss, 3)}
    return out


def main(argv: list[str]) -> int:
    base_only = argv[:1] == ["--base-only"]
    argv = argv[1:] if base_only else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root = Path(argv[0])
    if root.exists() and any(root.iterdir()):
        print(f"build_run: {root} is not empty; remove it or pick another directory", file=sys.stderr)
        return 1
    # One thread: the model is tiny, and a second intra-op thread only made each operation wait on it (46 CPU-s
    # on two busy cores instead of 7.5, the same weights bit for bit).
    torch.set_num_threads(1)
    start = time.monotonic()
    out = build(root, base_only=base_only)
    out["seconds"] = round(time.monotonic() - start, 1)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
