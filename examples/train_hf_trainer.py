"""A Hugging Face Trainer run on CPU whose checkpoints become ckptflow artifacts, published in the background.

``ArtifactCallback`` turns every ``checkpoint-N`` the Trainer saves into ``<run-dir>/checkpoint_artifacts/iter_N``
(files of its own: reflinks or copies, sealed, published in the background by the main process; the copy and
the seal run off the training loop unless ``--export sync``, the next save waiting for them); the
Trainer's ``save_total_limit`` may delete ``checkpoint-N`` meanwhile. ``--resume auto`` resumes from the run's
newest committed artifact (``resume_point``; a model-only one is refused, naming the files it lacks, a pruned
one naming ``ckptflow restore``, and a damaged one naming its remedy); a requeue of a run that had already saved
its last step catches up its publications and ends (``RunComplete``: ``"complete": true``). The model is any causal LM
directory (``--model``); the data are random token ids. Prints one JSON line (main process only): the
resume point, the exported iterations and the publication outcomes. Exit 3: refused (a start behind a
committed artifact, a pruned resume point, a destination the preflight rejects: on by default with
``--bucket``, ``--preflight off`` skips it), nothing trained.

    python examples/train_hf_trainer.py --model BASE --run-dir runs/proj/grp/run1/20261129T000000Z \\
        --steps 6 --save-every 2 --save-total-limit 1 --bucket my-bucket --credentials creds.json
    torchrun --nproc-per-node 2 examples/train_hf_trainer.py --model BASE --run-dir ... (the same flags)
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys

import torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

from ckptflow.errors import CkptflowError
from ckptflow.trainer import UploadSettings, wait_for_publications
from ckptflow.trainer.hf import ArtifactCallback, RunComplete, resume_point


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a causal LM directory (config.json + weights)")
    p.add_argument("--run-dir", required=True, help="the attempt directory <run>/<ts> (also the Trainer's output_dir)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--save-total-limit", type=int, default=None, help="the Trainer's own checkpoint-N retention")
    p.add_argument("--resume", choices=("auto", "off"), default="auto")
    p.add_argument("--bucket", help="upload to this bucket (name, s3://B, gs://B, file:///DIR); none: no upload")
    p.add_argument("--credentials")
    p.add_argument("--upload-prefix", help="<project>/<group>/<run>/<ts>/checkpoints (default: derived)")
    p.add_argument("--preflight", choices=("off", "on", "strict"), default="on",
                   help="with --bucket: check the destination at train begin, before the first step (default on; "
                   "strict: an unreachable endpoint fails too; off: no check)")
    p.add_argument("--export", choices=("async", "sync"), default="async",
                   help="export each checkpoint off the training loop, the next save waiting for it (async, the "
                   "default), or inside the Trainer's on_save (sync)")
    return p.parse_args(argv)


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, vocab_size: int, n: int = 64, length: int = 16):
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(16, vocab_size, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    code = train(args)
    if torch.distributed.is_initialized():
        # The DDP model (its reducer holds the process group) is freed first, while the group is still
        # registered, and every rank's last collective is done: freeing the group from the reducer, or while
        # a gloo thread still releases an earlier collective's tensors, can deadlock the process at exit.
        gc.collect()
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    return code


def train(args: argparse.Namespace) -> int:
    main_process = int(os.environ.get("RANK", "0")) == 0
    logging.basicConfig(level=logging.INFO if main_process else logging.WARNING,
                        format="train_hf_trainer: %(levelname)s: %(message)s", stream=sys.stderr)
    upload = UploadSettings(enabled=bool(args.bucket), bucket=args.bucket, credentials=args.credentials,
                            prefix=args.upload_prefix, preflight=args.preflight != "off",
                            strict=args.preflight == "strict")
    callback = ArtifactCallback(args.run_dir, upload, asynchronous=args.export == "async")
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    training = TrainingArguments(
        output_dir=args.run_dir, max_steps=args.steps, save_strategy="steps", save_steps=args.save_every,
        save_total_limit=args.save_total_limit, per_device_train_batch_size=2, learning_rate=1e-3,
        logging_steps=1, report_to="none", use_cpu=True, ddp_backend="gloo" if distributed else None,
        seed=0, disable_tqdm=True, dataloader_num_workers=0,
    )
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    trainer = Trainer(model=model, args=training, train_dataset=RandomTokens(model.config.vocab_size),
                      callbacks=[callback])
    complete = False
    try:
        start = resume_point(args.run_dir) if args.resume == "auto" else None
        trainer.train(resume_from_checkpoint=start)
    except RunComplete:  # a requeue after the last step: its publications caught up, nothing left to train
        complete = True
    except CkptflowError as exc:
        sys.stderr.write(f"train_hf_trainer: {exc}\n")
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
