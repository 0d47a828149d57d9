"""A TRL ``SFTTrainer`` run (a full fine-tune, or LoRA adapters with ``--lora``) whose checkpoints become ckptflow
artifacts, published in the background, and that a requeue resumes exactly.

The wiring is the one of the trainer docs' Hugging Face section: ``ArtifactCallback(run_dir, upload)`` among the
trainer's callbacks, ``trainer.train(resume_from_checkpoint=resume_point(run_dir))``, and ``RunComplete`` caught
around it (a requeue of a run that had already saved its last step catches up its publications and ends
there). ``resume_point`` refuses, naming the remedies, a newest artifact saved with ``--save-only-model``
(``save_only_model=True``: no optimizer, scheduler or RNG state), a pruned one and a damaged one;
``--resume-from DIR`` hands ``DIR`` to the Trainer directly instead (the callback's start check still refuses
a model-only one). The model is any causal LM directory with its tokenizer (``--model``); the data are a few
sentences built in memory (``datasets.Dataset.from_dict``). Prints one JSON line (main process only). Exit 3:
refused, nothing trained.

    python examples/train_trl_sft.py --model BASE --run-dir runs/proj/grp/run1/20261129T000000Z \\
        --steps 6 --save-every 2 --save-total-limit 1 --bucket my-bucket --credentials creds.json [--lora]
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from ckptflow.errors import CkptflowError
from ckptflow.trainer import UploadSettings, wait_for_publications
from ckptflow.trainer.hf import ArtifactCallback, RunComplete, resume_point


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a causal LM directory (config.json, weights, tokenizer)")
    p.add_argument("--run-dir", required=True, help="the attempt directory <run>/<ts> (also the trainer's output_dir)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--save-total-limit", type=int, default=None, help="the Trainer's own checkpoint-N retention")
    p.add_argument("--lora", action="store_true", help="train LoRA adapters (PEFT) instead of every weight")
    p.add_argument("--save-only-model", action="store_true",
                   help="save_only_model=True: model-only checkpoints, which no requeue can resume")
    p.add_argument("--resume-from", help="hand this checkpoint to the Trainer instead of resume_point(run_dir)")
    p.add_argument("--bucket", help="upload to this bucket (name, s3://B, gs://B, file:///DIR); none: no upload")
    p.add_argument("--credentials")
    return p.parse_args(argv)


def sentences(n: int = 48) -> Dataset:
    """Deterministic text in memory: no hub, no file."""
    words = ["the", "model", "reads", "a", "short", "line", "of", "text", "and", "learns", "its", "next", "word"]
    rows = [" ".join(words[(i * k) % len(words)] for k in range(1, 9 + i % 5)) for i in range(n)]
    return Dataset.from_dict({"text": rows})


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    code = train(args)
    if torch.distributed.is_initialized():  # as examples/train_hf_trainer.py ends a gloo job
        gc.collect()
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return code


def train(args: argparse.Namespace) -> int:
    main_process = int(os.environ.get("RANK", "0")) == 0
    logging.basicConfig(level=logging.INFO if main_process else logging.WARNING,
                        format="train_trl_sft: %(levelname)s: %(message)s", stream=sys.stderr)
    upload = UploadSettings(enabled=bool(args.bucket), bucket=args.bucket, credentials=args.credentials)
    callback = ArtifactCallback(args.run_dir, upload)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    config = SFTConfig(
        output_dir=args.run_dir, max_steps=args.steps, save_strategy="steps", save_steps=args.save_every,
        save_total_limit=args.save_total_limit, save_only_model=args.save_only_model, max_length=32,
        per_device_train_batch_size=2, learning_rate=1e-3, logging_steps=1, report_to="none", use_cpu=True,
        ddp_backend="gloo" if distributed else None, seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                      task_type="CAUSAL_LM") if args.lora else None
    trainer = SFTTrainer(model=model, args=config, train_dataset=sentences(),
                         processing_class=AutoTokenizer.from_pretrained(args.model), peft_config=lora,
                         callbacks=[callback])
    complete = False
    try:
        start = args.resume_from if args.resume_from else resume_point(args.run_dir)
        trainer.train(resume_from_checkpoint=start)
    except RunComplete:  # a requeue after the last step: its publications caught up, nothing left to train
        complete = True
    except CkptflowError as exc:
        sys.stderr.write(f"train_trl_sft: {exc}\n")
        return 3
    outcomes = wait_for_publications(args.run_dir)
    if main_process:
        sys.stdout.write(json.dumps({
            "run_dir": args.run_dir, "resumed_from": start, "exported": callback.exported, "complete": complete,
            "global_step": trainer.state.global_step,
            "published": [o.artifact_dir.name for o in outcomes if o.ok],
            "failed": [{"artifact": o.artifact_dir.name, "retry": o.retry} for o in outcomes if not o.ok],
        }, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
