"""A worker the multi-rank tests run under ``torchrun`` (gloo, CPU), or as one plain process.

``resume RUN_DIR OUT``: pin the attempt (the guard collective), build the example's model for
``--parallel``, load its resume point as examples/train_tiny.py does, and write on rank 0 the resume point
every rank got, the full model state and the full optimizer state (``OUT``, torch.save).

``fail RUN_DIR OUT``: a collective full-plan ``save_and_publish`` of iteration 2 in which rank 1 cannot
hash its shards (hashed once written, the read fails); every rank writes the error it raised to ``OUT.<rank>.json``. ``fail-async``: the same save
asynchronous, the error being the one ``wait_for_publications`` raised.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_tiny.py"


def example():
    spec = importlib.util.spec_from_file_location("train_tiny", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def resume(run_dir: str, out: str, parallel: str) -> None:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    from ckptflow.trainer import pin_run_attempt

    tiny = example()
    decision = pin_run_attempt(run_dir, "auto")
    model, optim = tiny.build(parallel)
    tiny.resume_state(model, optim, decision)
    points = [None] * dist.get_world_size() if dist.is_initialized() else [decision.resume_from]
    if dist.is_initialized():
        dist.all_gather_object(points, decision.resume_from)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {"points": points, "model": get_model_state_dict(model, options=full),
             "optim": get_optimizer_state_dict(model, optim, options=full)}
    if not dist.is_initialized() or dist.get_rank() == 0:
        torch.save(state, out)


def fail(run_dir: str, out: str, parallel: str, asynchronous: bool = False) -> None:
    import ckptflow.trainer.write as write
    from ckptflow.trainer import UploadSettings, save_and_publish, wait_for_publications

    tiny = example()
    model, optim = tiny.build(parallel)
    model(torch.randn(8, 16)).pow(2).mean().backward()
    optim.step()
    rank = dist.get_rank()
    if rank == 1:
        # Rank 1's shards are hashed once written (the path a torch without a hashable writer takes), and that
        # read fails: a failure on one rank after dcp.save's collective, before the seal.
        from torch.distributed.checkpoint import FileSystemWriter

        def broken(*args, **kwargs):
            raise OSError("input/output error reading a shard back")

        write._hashing_dcp_writer = lambda target, state: (FileSystemWriter(str(target)), {})
        write.hash_files = broken
    upload = UploadSettings(enabled=True, bucket=sys.argv[5])
    try:
        save_and_publish(run_dir, 2, {"model": model, "optimizer": optim, "trainer_state": {"optimizer_step": 2}}, upload,
                         asynchronous=asynchronous)
        wait_for_publications(run_dir)
        raised = None
    except Exception as exc:  # noqa: BLE001 - what each rank raised is the result
        raised = {"type": type(exc).__name__, "message": str(exc)}
    Path(f"{out}.{rank}.json").write_text(json.dumps(raised))


if __name__ == "__main__":
    mode, run_dir, out, parallel = sys.argv[1:5]
    if parallel != "none":
        dist.init_process_group("gloo")
    {"resume": resume, "fail": fail, "fail-async": lambda *a: fail(*a, asynchronous=True)}[mode](run_dir, out, parallel)
    if parallel != "none":
        dist.destroy_process_group()
