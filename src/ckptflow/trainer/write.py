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

``model.pt`` and ``trainer.pt`` are hashed as their bytes are written (``digest.HashingWriter``: on a helper
thread that runs beside ``torch.save``, without waiting for the tensors the save holds, the kernel asked to
start writing each tensor's bytes to disk at once), never read back; DCP shards likewise, as DCP writes them
(through the ``FileSystem`` of its ``FileSystemWriter``; a file it could not follow start to end is hashed
once written). The native manifest is committed last, atomically. A committed artifact of the same iteration
is never overwritten.

Ownership: before its first byte a save writes ``.save-in-progress`` (its holder, then each entry it
creates: ``model.pt``, ``optim/`` and its files, ``trainer.pt``, with the ``lstat`` identity seen right
after creating it, and again once complete) and removes it just before committing the manifest. An
interrupted save (no manifest) is discarded and written again only when every entry in the directory is
one its record names with that same identity (a file still being written: the same inode); anything else
(no record, a file the record does not name, a replaced or rewritten file, a user's unsealed model)
refuses the save by name and leaves every byte as it is (``ownership``). The DCP directory is recorded before any rank
writes into it; the DCP-named files directly inside it (``__R_N.distcp``, ``.metadata``) are that save's
even before rank 0 could record them (a rank killed between its shards and the seal).

``write_artifact(..., asynchronous=True)`` stages the state and runs ``write_now`` on a background thread
(``async_save``).

Crash points: ``trainer-save:writing-<file>``, ``trainer-save:rank<R>-durable-iter<N>`` (rank R's shards of
iteration N are fsynced, before it reports them), ``trainer-save:before-trainer-state``.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import re
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .. import __version__, testhooks
from ..artifact import ARTIFACTS_DIR, refuse_unrestorable_names
from ..digest import OVERLAP_MIN, HashingWriter, hash_files
from ..errors import CkptflowError, Refused, UsageError
from ..fsutil import (
    fsync_dir,
    start_writeback,
    walk_files,
)
from ..records import manifest as manifest_record
from ..records.inventory import FileEntry
from .ownership import Ownership, clear_interrupted
from .ranks import Ranks

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


def check_iteration(iteration: Any) -> None:
    if not isinstance(iteration, int) or isinstance(iteration, bool) or iteration < 0:
        raise UsageError(f"iteration {iteration!r} is not an integer >= 0")


def write_artifact(run_dir: Path | str, iteration: int, components: Mapping[str, Any], *,
                   collective: bool | None = None, asynchronous: bool = False) -> Any:
    """Write the planned components and commit the native manifest last; returns the manifest.

    Collective when a process group of several ranks is initialised (``ranks.Ranks``; ``collective=False``:
    this process saves alone): every rank calls it with its own model and optimizer; rank 0 clears an
    interrupted save, gathers the full model state (CPU offload) and writes ``model.pt`` and ``trainer.pt``;
    every rank writes and fsyncs its own DCP shards of ``optim/``; rank 0 seals only after every rank
    reported its part durable. A failure on any rank seals nothing and raises the same ``RankFailed`` on
    every rank; the directory stays uncommitted (``.save-in-progress``, no manifest).

    ``asynchronous=True`` (one process): stage a copy of the state and return a ``SaveHandle`` at once; a
    background thread writes and commits it (``async_save``). A synchronous save first waits for this
    process's background saves of the run and raises the failure of one not yet reported."""
    from . import async_save  # it builds on this module

    if asynchronous:
        return async_save.save_in_background(run_dir, iteration, components, collective=collective)
    check_iteration(iteration)
    async_save.settle(run_dir)
    return write_now(run_dir, iteration, components, collective=collective)


def write_now(run_dir: Path | str, iteration: int, components: Mapping[str, Any], *,
              collective: bool | None = None, ranks: Ranks | None = None) -> manifest_record.Manifest:
    """``write_artifact``'s synchronous save itself (the background thread of an asynchronous one runs it too,
    with ``ranks`` on a process group of its own)."""
    check_iteration(iteration)
    plan = check_plan(components)
    ranks = ranks or Ranks.current(collective)
    art = artifact_dir_for(run_dir, iteration)
    what = f"the save of {art}"

    def prepare() -> Ownership:
        refuse_committed(art, iteration)
        clear_interrupted(art)
        art.mkdir(parents=True)
        return Ownership(art)

    owned = ranks.decide(what, prepare)
    if not ranks.is_main:
        owned = None  # rank 0's record; the other ranks only write their shards
    try:
        return _write_owned(art, iteration, plan, components, ranks, owned, what)
    finally:
        if owned is not None:
            owned.ended()  # committed, or failed: its record proves what it wrote to the next save


def _write_owned(art: Path, iteration: int, plan: tuple[str, ...], components: Mapping[str, Any], ranks: Ranks,
                 owned: Ownership | None, what: str) -> manifest_record.Manifest:
    comps: dict[str, manifest_record.Component] = {}
    model = components["model"]
    error: Exception | None = None
    try:
        state = model_state(model, ranks)
        if ranks.is_main:
            comps["model"] = _save_hashed(art / MODEL_FILE, {"net": state}, owned)
            if "optimizer" in plan:
                _open_dcp_dir(art, OPTIM_DIR, owned)  # before any rank's shards
        del state
    except Exception as exc:  # noqa: BLE001 - settled with every rank below
        error = exc
    ranks.settle(what, error)
    shards: dict[str, Any] = {}
    error = None
    try:
        if "optimizer" in plan:
            shards = _save_dcp(art, OPTIM_DIR, optimizer_state(model, components["optimizer"]), ranks)
        testhooks.reached(f"trainer-save:rank{ranks.rank}-durable-iter{iteration}")
        testhooks.reached("trainer-save:before-trainer-state")
        if "trainer_state" in plan and ranks.is_main:
            comps["trainer"] = _save_hashed(art / TRAINER_FILE, _trainer_state(components["trainer_state"], iteration), owned)
    except Exception as exc:  # noqa: BLE001 - settled with every rank below
        error = exc
    reported = ranks.settle(what, error, shards)

    def seal() -> manifest_record.Manifest:
        if "optimizer" in plan:
            comps["optim"] = _dcp_component(art, OPTIM_DIR, reported, owned)
        record = manifest_record.Manifest(
            iteration=iteration, components=dict(sorted(comps.items(), key=lambda kv: _ORDER.index(kv[0]))),
            producer=manifest_record.Producer(tool="ckptflow trainer", version=__version__),
        )
        refuse_unrestorable_names(art, [f.path for f in record.physical_files()])
        owned.release()  # before the commit: a committed artifact never holds a stray record
        fsync_dir(art)
        manifest_record.write_manifest(art, record)
        return record

    return ranks.decide(what, seal)


_ORDER = ("model", "optim", "trainer")


def refuse_committed(art: Path, iteration: int) -> None:
    """Refuses (by name) a save into ``art`` when it is a committed artifact: it is never overwritten."""
    manifest_path = manifest_record.path_in(art)
    if manifest_path.exists() or manifest_path.is_symlink():
        raise Refused(
            f"{art} is already a committed artifact ({manifest_path.name} present); it is never overwritten",
            remedy=f"save iteration {iteration} under another run directory, or remove {art} yourself if it is unwanted",
        )


def model_state(model: Any, ranks: Ranks | None = None, *, to_cpu: bool = True) -> dict:
    """The consolidated state to save as ``model.pt``. Collective with a module: the full state dict
    gathered to rank 0 with CPU offload (``get_model_state_dict``: parameter names without DDP/FSDP
    wrapper prefixes), one tensor at a time, so no other rank holds the whole model; {} on the other ranks.
    ``to_cpu=False``: device tensors are left where they are (an asynchronous save stages them itself)."""
    if ranks is not None and ranks.collective and not isinstance(model, Mapping):
        import torch

        if isinstance(model, torch.nn.Module):
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            return state if ranks.is_main else {}
    if ranks is not None and not ranks.is_main:
        return {}
    state = model.state_dict() if hasattr(model, "state_dict") and callable(model.state_dict) else model
    if not isinstance(state, Mapping):
        raise UsageError(f"component model is a {type(model).__name__}, not a module or a state_dict")
    return {k: ((v.detach().cpu() if to_cpu else v.detach()) if hasattr(v, "detach") else v) for k, v in state.items()}


def optimizer_state(model: Any, optimizer: Any) -> dict:
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
    """``torch.save`` to a file object also calls ``flush``. After each tensor's bytes the kernel is asked to
    start writing them to disk (``fsutil.start_writeback``), so the disk works while the next tensor is
    written and hashed and the final ``fsync`` waits for little more than the last one."""

    def __init__(self, fh, *, stable=None):
        super().__init__(fh, stable=stable)
        self._target = fh

    def write(self, data) -> int:
        n = super().write(data)
        if n >= OVERLAP_MIN:
            self._target.flush()
            start_writeback(self._target.fileno())
        return n

    def flush(self) -> None:
        self._target.flush()


def held_tensor_memory(obj: Any) -> Callable[[memoryview], bool] | None:
    """Whether a buffer lies wholly inside the storage of a CPU tensor that ``obj`` holds (in mappings, lists
    and tuples). ``torch.save`` writes a CPU storage straight from the tensor's memory; while the caller holds
    ``obj`` and nothing changes its tensors (a synchronous save: the loop is inside the call; an asynchronous
    one: the save's own staged copy), such a buffer may be hashed after ``write`` returned
    (``HashingWriter(stable=...)``). Any other buffer (a CUDA tensor's temporary CPU copy, torch's own
    headers) is not in these spans and is hashed before ``write`` returns. None without numpy (which tells a
    buffer's address): every large buffer is then hashed beside its write."""
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with torch's wheels
        return None
    import torch

    spans: dict[int, int] = {}
    pending, seen = [obj], set()
    while pending:
        o = pending.pop()
        if isinstance(o, (Mapping, list, tuple)):
            if id(o) not in seen:
                seen.add(id(o))
                pending.extend(o.values() if isinstance(o, Mapping) else o)
        elif type(o) in (torch.Tensor, torch.nn.Parameter) and o.device.type == "cpu":
            storage = o.untyped_storage()
            if storage.nbytes():
                start = storage.data_ptr()
                spans[start] = max(spans.get(start, 0), start + storage.nbytes())
    starts = sorted(spans)
    ends = [spans[s] for s in starts]

    def stable(view: memoryview) -> bool:
        if not view.nbytes or not starts:
            return False
        addr = numpy.frombuffer(view, dtype=numpy.uint8).__array_interface__["data"][0]
        k = bisect.bisect_right(starts, addr) - 1
        return k >= 0 and addr + view.nbytes <= ends[k]

    return stable


def _save_hashed(path: Path, obj: Any, owned: Ownership) -> manifest_record.FileComponent:
    """``torch.save`` through a hashing writer: the digest costs no second read of the file, and is taken on
    a helper thread while ``torch.save`` goes on (``held_tensor_memory``); its tail runs beside the fsync."""
    import torch

    with open(path, "xb") as fh:
        owned.created(path.name, writing=True)
        hashing = _FlushingHashingWriter(fh, stable=held_tensor_memory(obj))
        try:
            torch.save(obj, hashing)
            testhooks.reached(f"trainer-save:writing-{path.name}", path.parent.name)
            fh.flush()
            os.fsync(fh.fileno())
            sha256 = hashing.hexdigest()
        finally:
            hashing.close()
    owned.created(path.name, writing=False)
    return manifest_record.FileComponent(path=path.name, size=hashing.size, sha256=sha256)


def _open_dcp_dir(art: Path, name: str, owned: Ownership) -> None:
    """Rank 0 creates the DCP directory (exclusively) and records it before any rank writes a shard."""
    (art / name).mkdir()
    owned.created(name, writing=True, dcp=True)  # its identity changes as DCP fills it: its inode is the proof


def _save_dcp(art: Path, name: str, state: dict, ranks: Ranks) -> dict[str, tuple[int, str]]:
    """Every rank: ``dcp.save`` (collective with a process group), each file hashed as DCP writes it
    (``_hashing_dcp_writer``), then fsync the files this rank wrote (``__<rank>_*``; rank 0 also
    ``.metadata``); a file the writer could not hash start to end is hashed here; returns them as
    {relative path: (size, sha256)}."""
    import torch.distributed.checkpoint as dcp

    target = art / name
    writer, hashed = _hashing_dcp_writer(target, state)
    with warnings.catch_warnings():  # single process without a process group is the intended use here
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.save({name: state}, checkpoint_id=str(target), storage_writer=writer, process_group=ranks.group)
    files = [rel for rel in walk_files(target) if _own_shard(rel, ranks)]
    found = {rel: hashed[rel] for rel in files if rel in hashed and hashed[rel][0] == (target / rel).stat().st_size}
    if rest := [rel for rel in files if rel not in found]:
        found.update({rel: (d.size, d.sha256) for rel, d in
                      hash_files(target, rest, progress=False, desc=f"{name} sha256").items()})
    for rel in files:
        with open(target / rel, "rb") as fh:
            os.fsync(fh.fileno())
    return found


class _HashedStream:
    """A file DCP writes, every byte hashed as written (``HashingWriter``: pipelined where the bytes are the
    saved state's), the kernel asked to start writing each tensor's bytes to disk at once, as for
    ``model.pt`` (``_FlushingHashingWriter``). ``complete`` stays true only while the bytes went in order
    through ``write``: a seek, or any use of the file this wrapper does not know, makes the file hashed again
    once written."""

    def __init__(self, raw, stable):
        self._raw = raw
        self._hashing = HashingWriter(raw, stable=stable)
        self.complete = True

    def write(self, data) -> int:
        n = self._hashing.write(data)
        if n >= OVERLAP_MIN:
            self._raw.flush()
            start_writeback(self._raw.fileno())
        return n

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        self._raw.close()

    def __getattr__(self, attr: str) -> Any:
        self.complete = False  # seek, writelines, truncate ...: not proven by the digest
        return getattr(self._raw, attr)

    def digest(self) -> tuple[int, str]:
        return self._hashing.size, self._hashing.hexdigest()


def _hashing_dcp_writer(target: Path, state: Any) -> tuple[Any, dict[str, tuple[int, str]]]:
    """A ``FileSystemWriter`` for ``target`` whose files are hashed while DCP writes them, through its public
    ``FileSystem`` (``create_stream``, ``rename``), and the dict it fills: {file relative to ``target``:
    (size, sha256)} for each file written start to end through it. A torch whose writer has no ``fs`` of
    that kind writes as usual and the dict stays empty (the files are then hashed after ``dcp.save``)."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint.filesystem import FileSystem

    hashed: dict[str, tuple[int, str]] = {}
    stable = held_tensor_memory(state)

    def rel(path: Any) -> str | None:
        try:
            return Path(path).relative_to(target).as_posix()
        except ValueError:
            return None

    class HashingFileSystem(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path, mode):
            with super().create_stream(path, mode) as raw:
                if mode != "wb" or rel(path) is None:
                    yield raw
                    return
                stream = _HashedStream(raw, stable)
                try:
                    yield stream
                finally:
                    size, sha256 = stream.digest()  # stops the helper thread, also after a failure
                if stream.complete:
                    hashed[rel(path)] = (size, sha256)

        def rename(self, path, new_path) -> None:
            super().rename(path, new_path)
            digest = hashed.pop(rel(path), None)
            if digest is not None and rel(new_path) is not None:
                hashed[rel(new_path)] = digest

    writer = FileSystemWriter(str(target))
    if type(getattr(writer, "fs", None)) is FileSystem:
        writer.fs = HashingFileSystem()
    return writer, hashed


def _own_shard(rel: str, ranks: Ranks) -> bool:
    if not ranks.collective:
        return True
    if rel.startswith(f"__{ranks.rank}_"):
        return True
    return ranks.is_main and not re.match(r"^__\d+_", rel)


def _dcp_component(art: Path, name: str, reported: list[dict[str, tuple[int, str]]],
                   owned: Ownership) -> manifest_record.DcpComponent:
    """Rank 0, once every rank reported its shards durable: the component of every file in the directory
    (a file no rank reported is hashed here), recorded as this save's."""
    target = art / name
    found: dict[str, tuple[int, str]] = {}
    for shards in reported:
        found.update(shards or {})
    files = list(walk_files(target))
    if missing := sorted(set(found) - set(files)):
        raise CkptflowError(f"{target}: shards reported written are not there: {', '.join(missing[:5])}",
                            remedy="check that every rank writes to the same shared file system, then save again")
    if rest := [rel for rel in files if rel not in found]:
        for rel, d in hash_files(target, rest, progress=False, desc=f"{name} sha256").items():
            with open(target / rel, "rb") as fh:
                os.fsync(fh.fileno())
            found[rel] = (d.size, d.sha256)
    fsync_dir(target)
    owned.completed(*(f"{name}/{rel}" for rel in files))  # every shard at once: one rewrite of the record
    return manifest_record.DcpComponent(
        path=name, files=tuple(FileEntry(rel, *found[rel]) for rel in sorted(files))
    )
