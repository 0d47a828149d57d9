"""Trainer artifacts for the materialize tests: a tiny Qwen3 trained for 2 CPU steps by TRL's ``SFTTrainer`` (a
full fine-tune, and a LoRA run through PEFT) with ``ckptflow.trainer.hf.ArtifactCallback``, in this process."""

from __future__ import annotations

from pathlib import Path

RUN = "proj/grp/run1/20261129T000000Z"


def _dataset(n: int = 16):
    from datasets import Dataset

    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    return Dataset.from_list([{"text": " ".join(words[(i + k) % len(words)] for k in range(12))} for i in range(n)])


def train_sft(base: Path, run_dir: Path, *, lora: bool = False, steps: int = 2) -> Path:
    """Train ``steps`` steps from ``base`` (saving at the last), export through the callback; returns ``iter_N``."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from ckptflow.trainer.hf import ArtifactCallback
    from helpers.tiny_models import quiet_transformers

    with quiet_transformers():
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(base))
        config = SFTConfig(output_dir=str(run_dir), max_steps=steps, save_strategy="steps", save_steps=steps,
                           per_device_train_batch_size=2, learning_rate=1e-2, logging_steps=1, report_to="none",
                           use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0, max_length=32,
                           bf16=False, fp16=False)
        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                 task_type="CAUSAL_LM") if lora else None
        trainer = SFTTrainer(model=model, args=config, train_dataset=_dataset(), processing_class=tokenizer,
                             peft_config=peft_config, callbacks=[ArtifactCallback(run_dir)])
        trainer.train()
    return run_dir / "checkpoint_artifacts" / f"iter_{steps:06d}"
