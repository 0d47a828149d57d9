"""Hugging Face Trainer artifacts for the teacher tests: a tiny model trained for 2 CPU steps by TRL's
``SFTTrainer`` (a full fine-tune, or a LoRA run through PEFT) with ``ckptflow.trainer.hf.ArtifactCallback``, in
this process; optionally published to a file:// archive by the callback."""

from __future__ import annotations

import warnings
from pathlib import Path

RUN = "proj/grp/run1/20261129T000000Z"
STEPS = 2


def _dataset(n: int = 16):
    from datasets import Dataset

    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    return Dataset.from_list([{"text": " ".join(words[(i + k) % len(words)] for k in range(12))} for i in range(n)])


def train_sft(base: Path, run_dir: Path, *, lora: bool = False, archive: Path | None = None) -> Path:
    """Train ``STEPS`` steps from ``base``, saving at the last; returns the artifact ``iter_N`` the callback
    exported (and, with ``archive``, published to ``file://archive``: it needs the archive's probe record)."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from ckptflow.trainer import UploadSettings
    from ckptflow.trainer.hf import ArtifactCallback
    from helpers.tiny_models import quiet_transformers

    upload = UploadSettings(enabled=True, bucket=f"file://{archive}") if archive is not None else None
    with quiet_transformers(), warnings.catch_warnings():
        # TRL 1.16 and PEFT 0.21 still call transformers' deprecated gradient_checkpointing names
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(base))
        config = SFTConfig(output_dir=str(run_dir), max_steps=STEPS, save_strategy="steps", save_steps=STEPS,
                           per_device_train_batch_size=2, learning_rate=1e-2, logging_steps=1, report_to="none",
                           use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0, max_length=32)
        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0,
                                 task_type="CAUSAL_LM") if lora else None
        trainer = SFTTrainer(model=model, args=config, train_dataset=_dataset(), processing_class=tokenizer,
                             peft_config=peft_config, callbacks=[ArtifactCallback(run_dir, upload)])
        trainer.train()
    return run_dir / "checkpoint_artifacts" / f"iter_{STEPS:06d}"
