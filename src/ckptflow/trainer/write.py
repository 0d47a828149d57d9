"""Write one artifact at a trainer's save: ``<run_dir>/checkpoint_artifacts/iter_NNNNNN/``.

``run_dir`` is the attempt directory ``<run>/<ts>``. The component plan is a prefix of
``[model, optimizer, trainer_state]`` (``components`` maps each planned name to its value):

- ``model``: an ``nn.Module`` or a ``state_dict``, saved consolidated as ``model.pt`` = ``{"net": state_dict}``
  (manifest component ``model``);
- ``optimizer``: a ``torch.optim.Optimizer`` (its state keyed by parameter name through
  ``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` when ``model`` is a module) or an
  optimizer ``state_dict``, saved as a DCP directory ``optim/`` by ``torch.distributed.checkpoint``
  (single process is enough; manifest component ``optim``);
- ``trainer_state``: a mapping with at least ``optimizer_step``, saved as ``trainer.pt`` with ``iter`` set to
  the iteration (manifest component ``trainer``).

``model.pt`` and ``trainer.pt`` are hashed as their bytes are written (``digest.HashingWriter``), never
read back; DCP shards are hashed right after DCP wrote them. The native manifest is committed last,
atomically. A committed artifact of the same iteration is never overwritten; an interrupted save of it
(the directory without its manifest) is discarded and written again.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import __version__
from ..artifact import ARTIFACTS_DIR, refuse_unrestorable_names
from ..digest import HashingWriter, hash_files
from ..errors import Refused, UnsafePath, UsageError
from ..fsutil import fsync_dir, walk_files
from ..records import manifest as manifest_record
from ..records.inventory import FileEntry

log = logging.getLogger(__name__)

PLAN = ("model", "optimizer", "trainer_state")
MODEL_FILE, OPTIM_DIR, TRAINER_FILE = "model.pt", "optim", "trainer.pt"


def artifact_dir_for(run_dir: Path | str, iteration: int) -> Path:
    return Path(run_dir) / ARTIFACTS_DIR / f"iter_{iteration:06d}"


def check_plan(components: Mapping[str, Any]) -> tuple[str, ...]:
    """The plan's names in order; refuses anything but a non-empty prefix of ``PLAN``."""
    names = tuple(components)
    if not names or set(names) != set(PLAN[: len(names)]):
        raise UsageError(
            f"component plan {list(names)} is not one of [model], [model, optimizer], [model, optimizer, trainer_state]",
            remedy="save the model, and optionally the optimizer, and optionally the trainer state",
        )
    return PLAN[: len(names)]


def write_artifact(run_dir: Path | str, iteration: int, components: Mapping[str, Any]) -> manifest_record.Manifest:
    """Write the planned components and commit the native manifest last; returns the manifest."""
    if not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0:
        raise UsageError(f"iteration {iteration!r} is not an integer >= 0")
    plan = check_plan(components)
    art = artifact_dir_for(run_dir, iteration)
    manifest_path = manifest_record.path_in(art)
    if manifest_path.exists() or manifest_path.is_symlink():
        raise Refused(
            f"{art} is already a committed artifact ({manifest_path.name} present); it is never overwritten",
            remedy=f"save iteration {iteration} under another run directory, or remove {art} yourself if it is unwanted",
        )
    _clear_interrupted(art)
    art.mkdir(parents=True)
    comps: dict[str, manifest_record.Component] = {}
    model = components["model"]
    comps["model"] = _save_hashed(art / MODEL_FILE, {"net": _model_state(model)})
    if "optimizer" in plan:
        comps["optim"] = _save_dcp(art, OPTIM_DIR, _optimizer_state(model, components["optimizer"]))
    if "trainer_state" in plan:
        comps["trainer"] = _save_hashed(art / TRAINER_FILE, _trainer_state(components["trainer_state"], iteration))
    record = manifest_record.Manifest(
        iteration=iteration, components=comps,
        producer=manifest_record.Producer(tool="ckptflow trainer", version=__version__),
    )
    refuse_unrestorable_names(art, [f.path for f in record.physical_files()])
    fsync_dir(art)
    manifest_record.write_manifest(art, record)
    return record


def _clear_interrupted(art: Path) -> None:
    if art.is_symlink():
        raise UnsafePath(f"artifact directory {art} is a symlink", remedy="remove the link; the trainer writes a real directory")
    if not art.exists():
        return
    # Only the names a save writes may be discarded: anything else in the directory is not ours.
    entries = {e.name: e for e in os.scandir(art)}
    foreign = sorted(set(entries) - {MODEL_FILE, TRAINER_FILE, OPTIM_DIR})
    if foreign:
        raise Refused(f"{art} holds an interrupted save (no manifest) and files a save does not write: "
                      f"{', '.join(foreign[:20])}{' ...' if len(foreign) > 20 else ''}",
                      remedy="move those files out of the artifact directory, then save again")
    log.warning("%s holds an interrupted save (no manifest); discarding it and writing iteration again", art)
    for entry in entries.values():
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
    os.rmdir(art)  # empty now; a file written there meanwhile makes this fail rather than vanish


def _model_state(model: Any) -> dict:
    state = model.state_dict() if hasattr(model, "state_dict") and callable(model.state_dict) else model
    if not isinstance(state, Mapping):
        raise UsageError(f"component model is a {type(model).__name__}, not a module or a state_dict")
    return {k: (v.detach().cpu() if hasattr(v, "detach") else v) for k, v in state.items()}


def _optimizer_state(model: Any, optimizer: Any) -> dict:
    if isinstance(optimizer, Mapping):
        return dict(optimizer)
    import torch

    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UsageError(f"component optimizer is a {type(optimizer).__name__}, not an optimizer or its state_dict")
    if isinstance(model, torch.nn.Module):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer)
    return optimizer.state_dict()


def _trainer_state(state: Any, iteration: int) -> dict:
    if not isinstance(state, Mapping) or "optimizer_step" not in state:
        raise UsageError("component trainer_state must be a mapping with optimizer_step",
                         remedy="pass {'optimizer_step': <steps taken>} (iter is set to the iteration)")
    step = state["optimizer_step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise UsageError(f"trainer_state optimizer_step {step!r} is not an integer >= 0")
    if "iter" in state and state["iter"] != iteration:
        raise UsageError(f"trainer_state iter {state['iter']!r} differs from the saved iteration {iteration}")
    return {**state, "optimizer_step": step, "iter": iteration}


class _FlushingHashingWriter(HashingWriter):
    """``torch.save`` to a file object also calls ``flush``."""

    def __init__(self, fh):
        super().__init__(fh)
        self._target = fh

    def flush(self) -> None:
        self._target.flush()


def _save_hashed(path: Path, obj: Any) -> manifest_record.FileComponent:
    """``torch.save`` through a hashing writer: the digest costs no second read of the file."""
    import torch

    with open(path, "xb") as fh:
        hashing = _FlushingHashingWriter(fh)
        torch.save(obj, hashing)
        fh.flush()
        os.fsync(fh.fileno())
    return manifest_record.FileComponent(path=path.name, size=hashing.size, sha256=hashing.hexdigest())


def _save_dcp(art: Path, name: str, state: dict) -> manifest_record.DcpComponent:
    import torch.distributed.checkpoint as dcp

    target = art / name
    with warnings.catch_warnings():  # single process without a process group is the intended use here
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.save({name: state}, checkpoint_id=str(target))
    files = list(walk_files(target))
    digests = hash_files(target, files, progress=False, desc="optim sha256")
    for rel in files:
        with open(target / rel, "rb") as fh:
            os.fsync(fh.fileno())
    fsync_dir(target)
    return manifest_record.DcpComponent(
        path=name, files=tuple(FileEntry(rel, d.size, d.sha256) for rel, d in digests.items())
    )
