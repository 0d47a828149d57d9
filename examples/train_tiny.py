"""A tiny training loop on CPU that uses the trainer API end to end.

It pins its attempt directory with the resume guard (refused: exit 3, nothing written), trains a small
MLP for ``--steps`` optimizer steps, saves an artifact every ``--save-every`` steps with
``save_and_publish`` (publication runs in the background while the next steps go on; with
``--async-save`` the write and commit too, the loop paying only for a copy of the state), waits for the
publications at the end and prints one JSON line: the saved iterations and the publication outcomes.
A failed upload never stops training: the artifact stays local and the log names the command that
publishes it later (or ``snakemake publish_all``). At start it queues the publication of every committed
artifact of the attempt left without a receipt (a requeued job catches up what a killed one did not finish).

Under ``torchrun`` it runs on every rank (``--parallel ddp``, the default there, or ``fsdp``: FSDP2
``fully_shard``), with ``gloo`` on CPU: every rank calls the same API collectively (rank 0 decides the
resume point, checks the destination and publishes; every rank writes its optimizer shards), and rank 0
alone prints the JSON line.

Each save holds one of three plans (``--components``): ``model``, ``model,optimizer`` or the full plan
``model,optimizer,trainer_state``, the default, the one a requeued job resumes from. When ``--bucket`` is
given, the destination is checked before step 1 (``preflight``; ``--preflight off`` skips it): a missing
bucket, rejected credentials or a prefix of another run exit 3 on every rank before any step.

    torchrun --nproc-per-node 2 examples/train_tiny.py --parallel fsdp --run-dir ... --bucket file:///tmp/archive

    python examples/train_tiny.py --run-dir runs/proj/grp/run1/20261129T000000Z --steps 8 --save-every 2 \\
        --bucket my-bucket --credentials creds.json --upload-prefix proj/grp/run1/20261129T000000Z/checkpoints
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

import torch

from ckptflow.errors import Refused
from ckptflow.trainer import (
    UploadSettings,
    preflight,
    publish_pending,
    save_and_publish,
    wait_for_publications,
)
from ckptflow.trainer.resume import pin_run_attempt

PLANS = {"model": ["model"], "model,optimizer": ["model", "optimizer"],
         "model,optimizer,trainer_state": ["model", "optimizer", "trainer_state"]}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True, help="the attempt directory <run>/<ts>")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--save-every", type=int, default=2)
    p.add_argument("--components", choices=list(PLANS), default="model,optimizer,trainer_state", metavar="PLAN",
                   help="what each save holds, one of three plans: " + " | ".join(PLANS)
                   + " (default: the full plan, the one a requeue resumes from)")
    p.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (simulated work)")
    p.add_argument("--resume", choices=("auto", "off"), default="auto")
    p.add_argument("--resume-path")
    p.add_argument("--bucket", help="upload to this bucket (name, s3://B, gs://B, file:///DIR); none: no upload")
    p.add_argument("--credentials")
    p.add_argument("--upload-prefix", help="<project>/<group>/<run>/<ts>/checkpoints")
    p.add_argument("--preflight", choices=("off", "on", "strict"), default="on",
                   help="with --bucket: check the upload destination before step 1 (default on; strict: an "
                   "unreachable endpoint fails too; off: no check)")
    p.add_argument("--async-save", action="store_true",
                   help="save asynchronously: each save copies the state and returns, a background thread writes, "
                        "commits and queues the publication (every rank its own shards; rank 0 seals)")
    p.add_argument("--parallel", choices=("none", "ddp", "fsdp"),
                   help="none: one process; ddp / fsdp: every rank of torchrun (gloo); default ddp under torchrun")
    args = p.parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    args.parallel = args.parallel or ("ddp" if world > 1 else "none")
    if args.parallel == "none" and world > 1:
        p.error(f"--parallel none runs one process, but WORLD_SIZE is {world}: pass --parallel ddp or fsdp")
    return args


def build(parallel: str):
    """The model (wrapped for its parallelism) and its optimizer; the same initial weights on every rank."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    if parallel == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif parallel == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def say(line: str, rank: int = 0) -> None:
    """A line on stdout, from rank 0 only."""
    if rank:
        return
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def resume_state(model, optim, decision) -> int:
    """Load the model (and the optimizer, when saved as DCP) of the resume point; its iteration.

    The resume point was judged by ``pin_run_attempt`` (real path, trainer state); one holding no
    ``model.pt`` this loop can load is refused rather than trained on from random weights."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    src = Path(decision.resume_from)
    if not (src / "model.pt").is_file():
        raise Refused(f"resume point {src} holds no model.pt this example can load",
                      remedy="resume from a checkpoint or full-plan artifact directory this example saved")
    distributed = torch.distributed.is_initialized()
    main = not distributed or torch.distributed.get_rank() == 0
    # model.pt is read by rank 0 only and broadcast: no other rank holds the whole consolidated file.
    full = torch.load(src / "model.pt", weights_only=True)["net"] if main else {}
    set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed))
    if (src / "optim").is_dir():  # DCP reshards to this world size
        state = {"optim": get_optimizer_state_dict(model, optim)}
        dcp.load(state, checkpoint_id=str(src / "optim"))
        set_optimizer_state_dict(model, optim, state["optim"])
    return decision.resume_iteration


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.parallel != "none":
        torch.distributed.init_process_group("gloo")
    try:
        return train(args)
    finally:
        if args.parallel != "none":
            torch.distributed.destroy_process_group()


def train(args: argparse.Namespace) -> int:
    rank = torch.distributed.get_rank() if args.parallel != "none" else 0
    name = f"train_tiny[{rank}]" if args.parallel != "none" else "train_tiny"
    logging.basicConfig(level=logging.INFO, format=f"{name}: %(levelname)s: %(message)s", stream=sys.stderr)
    try:
        decision = pin_run_attempt(args.run_dir, args.resume, args.resume_path)  # rank 0 decides, every rank follows
    except Refused as exc:
        sys.stderr.write(f"train_tiny: {exc}\n")
        return 3
    run_dir = Path(decision.attempt_dir)
    model, optim = build(args.parallel)
    try:
        start = resume_state(model, optim, decision) if decision.decision == "resume" else 0
    except Refused as exc:
        sys.stderr.write(f"train_tiny: {exc}\n")
        return 3
    upload = UploadSettings(enabled=bool(args.bucket), bucket=args.bucket, credentials=args.credentials,
                            prefix=args.upload_prefix, preflight=args.preflight != "off",
                            strict=args.preflight == "strict")
    try:
        if upload.enabled and upload.preflight:  # collective: rank 0 checks, every rank gets its outcome
            preflight(run_dir, upload)
    except Refused as exc:
        sys.stderr.write(f"train_tiny: {exc}\n")
        return 3
    publish_pending(run_dir, upload)  # rank 0: what a killed job committed but did not publish
    if args.parallel != "none":
        torch.manual_seed(1000 * rank + start)  # each rank its own data
    saved = []
    for step in range(start + 1, args.steps + 1):
        optim.zero_grad()
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        optim.step()
        time.sleep(args.step_seconds)
        say(f"step {step} loss {loss.item():.4f} t={time.time():.3f}", rank)
        if step % args.save_every == 0:
            plan = PLANS[args.components]
            values = {"model": model, "optimizer": optim, "trainer_state": {"optimizer_step": step}}
            handle = save_and_publish(run_dir, step, {k: values[k] for k in plan}, upload,
                                      asynchronous=args.async_save)
            saved.append(step)
            if args.async_save:  # staged: the next steps run while a background thread writes it
                say(f"staged iter_{step:06d} in {handle.stall_s:.3f} s t={time.time():.3f}", rank)
            else:
                say(f"saved iter_{step:06d} t={time.time():.3f}", rank)
    outcomes = wait_for_publications(run_dir)  # the saves first; rank 0 waits; the others return at once
    if rank:
        return 0
    say(json.dumps({
        "run_dir": str(run_dir), "saved": saved,
        "published": [o.artifact_dir.name for o in outcomes if o.ok],
        "failed": [{"artifact": o.artifact_dir.name, "retry": o.retry} for o in outcomes if not o.ok],
    }, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
