"""Asynchronous saves: the training loop pays for a copy of the state, a background thread for the rest.

``write_artifact(..., asynchronous=True)`` and ``save_and_publish(..., asynchronous=True)`` come here.
At the call, the state of each planned component is staged: every tensor is copied to CPU memory the
save owns (a CPU tensor's whole storage, cloned once however many tensors share it, so the file is the
one a synchronous save of the same state writes; a CUDA tensor into pinned memory by a non-blocking
device-to-host copy, ordered before whatever the loop enqueues next on the same stream, and waited for by
the background thread before it writes). The call then returns a ``SaveHandle``; a background thread
writes the components, hashes them as they are written, commits the manifest last (``write.write_now``:
the same code, the same ownership record and crash points as a synchronous save) and, for
``save_and_publish``, queues the publication. Whatever the loop does after the call (an optimizer step)
never reaches the artifact.

Memory: at most one staged copy per process. A second asynchronous save (of any run) while the first is
still writing waits for it before staging; that wait is stall, reported in the handle (``waited_s``) and
the log. A save costs the loop ``waited_s + staged_s`` and the process one copy of the saved state (CPU
tensors), kept after the write for the next save's copy (fresh memory costs twice the copy to allocate
and touch; ``release_staging_memory`` frees it).

Many ranks (a process group of several ranks initialised, every rank making the call): at the call, the
full model state is gathered to rank 0 over the training's group (as a synchronous save does) and staged
there, and every rank stages its own optimizer state (a ``DTensor``'s local shard, on the same mesh).
Each rank's background thread then writes its own DCP shards, and rank 0 writes ``model.pt`` and
``trainer.pt`` and seals once every rank reported its shards durable, all of it agreed over a gloo process
group of the saves' own (created by the first asynchronous save, collectively), so the training's
collectives never wait for the save's, nor the save's for them. A failure on one rank commits nothing, and
every rank raises the same ``RankFailed``, wrapped as ``BackgroundSaveFailed``, at its next save or wait.

Failures are never silent: a background failure leaves the artifact uncommitted (``.save-in-progress``, no
manifest: the resume guard and ``publish_pending`` never see it) and raises ``BackgroundSaveFailed``, naming
the iteration and the cause, at ``SaveHandle.result()``, at the run's next save, or at
``wait_for_publications``, whichever comes first (once). A process killed during the background write
leaves the same uncommitted directory, which the next save of that iteration discards by its record.

``run_in_background`` runs a save that stages nothing (the Hugging Face callback's export of the files the
Trainer wrote, ``hf.copy_and_seal``) on a background thread as one of the run's saves: the same handle, waits
and failure reports, and its ranks agree over the same gloo group (``background_ranks``).

Crash points: ``trainer-async:staged`` (the state is staged, the background thread not started),
``trainer-async:before-write`` (on the background thread, before the first byte), then those of a
synchronous save (``write.py``), reached on the background thread.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from .. import testhooks
from ..errors import CkptflowError
from ..records import manifest as manifest_record
from .ranks import Ranks
from .write import (
    artifact_dir_for,
    check_iteration,
    check_plan,
    model_state,
    optimizer_state,
    refuse_committed,
    write_now,
)

log = logging.getLogger(__name__)


class BackgroundSaveFailed(CkptflowError):
    """An asynchronous save failed on its background thread; nothing was committed."""

    def __init__(self, message: str, *, remedy: str | None = None, iteration: int | None = None):
        super().__init__(message, remedy=remedy)
        self.iteration = iteration


class SaveHandle:
    """One asynchronous save. ``result(timeout)`` returns the committed manifest or raises
    ``BackgroundSaveFailed``; ``done()`` says whether the background thread ended. ``waited_s``: how long
    the call waited for the process's previous asynchronous save (one staged copy at a time); ``staged_s``:
    how long it copied the state. Both are the loop's stall."""

    def __init__(self, run_dir: Path, iteration: int, *, remedy: str | None = None):
        self.run_dir = run_dir
        self.iteration = iteration
        self._remedy = remedy  # what to do when nothing was committed (default: save that iteration again)
        self.artifact_dir = artifact_dir_for(run_dir, iteration)
        self.waited_s = 0.0
        self.staged_s = 0.0
        self._done = threading.Event()
        self._manifest: manifest_record.Manifest | None = None
        self._error: BackgroundSaveFailed | None = None
        self._reported = False

    @property
    def stall_s(self) -> float:
        return self.waited_s + self.staged_s

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> manifest_record.Manifest:
        if not self._done.wait(timeout):
            raise TimeoutError(f"the background save of iteration {self.iteration} ({self.artifact_dir}) "
                               f"is still running after {timeout} s")
        if self._error is not None:
            self._reported = True
            raise self._error
        assert self._manifest is not None
        return self._manifest

    def _fail(self, exc: BaseException) -> None:
        if self._manifest is not None:  # committed; what came after (preflight, queueing the publication) failed
            self._error = BackgroundSaveFailed(
                f"the background save of iteration {self.iteration} committed {self.artifact_dir}, then failed: "
                f"{type(exc).__name__}: {exc}", iteration=self.iteration,
                remedy=f"the artifact is kept; fix the cause and publish it with `ckptflow publish --artifact-dir "
                       f"{self.artifact_dir}` or `snakemake publish_all`")
        else:
            self._error = BackgroundSaveFailed(
                f"the background save of iteration {self.iteration} ({self.artifact_dir}) failed: "
                f"{type(exc).__name__}: {exc}; nothing was committed",
                remedy=self._remedy or "fix the cause, then save again (the next save of that iteration discards "
                       "the uncommitted directory by its ownership record)", iteration=self.iteration)
        self._error.__cause__ = exc


_SLOT = threading.Lock()  # held from staging until the background write ends: one staged copy per process
_LOCK = threading.Lock()
_HANDLES: list[SaveHandle] = []  # running, or failed and not yet reported


def _run_key(run_dir: Path | str) -> Path:
    return Path(run_dir).resolve()


def settle(run_dir: Path | str | None = None, timeout: float | None = None) -> None:
    """Wait for this process's asynchronous saves of ``run_dir`` (every run when None), then raise the
    first background failure of that run not yet reported (``BackgroundSaveFailed``). Nothing to do, at
    once, in a process that never saved asynchronously."""
    key = None if run_dir is None else _run_key(run_dir)
    with _LOCK:
        mine = [h for h in _HANDLES if key is None or _run_key(h.run_dir) == key]
    deadline = None if timeout is None else time.monotonic() + timeout
    for handle in mine:
        handle._done.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
    _raise_failure(key)


def _raise_failure(key: Path | None) -> None:
    """Raise the first failure of a finished background save of run ``key`` (any when None) not yet reported;
    forget the finished saves that have nothing left to report."""
    with _LOCK:
        mine = [h for h in _HANDLES if h.done() and (key is None or _run_key(h.run_dir) == key)]
        failed = next((h for h in mine if h._error is not None and not h._reported), None)
        if failed is not None:
            failed._reported = True
        for h in mine:
            if h._error is None or h._reported:
                _HANDLES.remove(h)
    if failed is not None:
        raise failed._error


def save_in_background(run_dir: Path | str, iteration: int, components: Mapping[str, Any], *,
                       collective: bool | None = None,
                       then: Callable[[manifest_record.Manifest], Any] | None = None) -> SaveHandle:
    """Stage the state of ``components`` now and write, hash and commit it on a background thread;
    ``then(manifest)`` runs there after the commit (the publication of ``save_and_publish``)."""
    check_iteration(iteration)
    plan = check_plan(components)
    ranks = Ranks.current(collective)
    background = background_ranks(ranks)  # collective: a gloo group of the save's own, created at the first save
    run_dir = Path(run_dir)
    _raise_failure(_run_key(run_dir))  # an earlier background failure of this run raises here, at the next save
    handle = SaveHandle(run_dir, iteration)
    if not ranks.collective:
        refuse_committed(handle.artifact_dir, iteration)  # at the call, as a synchronous save refuses it
    start = time.monotonic()
    if not _SLOT.acquire(blocking=False):
        _SLOT.acquire()
        handle.waited_s = time.monotonic() - start
        log.warning("the save of iteration %d waited %.2f s for this process's previous background save "
                    "(one staged copy per process)", iteration, handle.waited_s)
        try:
            _raise_failure(_run_key(run_dir))  # the save waited for may have failed: raised at this, the next save
        except BaseException:
            _SLOT.release()
            raise
    try:
        staged_at = time.monotonic()
        staged, ready = stage_components(components, plan, ranks)
        handle.staged_s = time.monotonic() - staged_at
        testhooks.reached("trainer-async:staged")
        with _LOCK:
            _HANDLES.append(handle)
        box = [staged]  # the worker empties it: the copy is freed before the next save may stage
        del staged
        worker = threading.Thread(target=_write_staged, args=(handle, box, ready, background, then),
                                  name=f"ckptflow-save-iter{iteration}")
        worker.start()  # not a daemon: an interpreter that exits after the call still commits the save
    except BaseException:
        _ARENA.keep_used()
        _SLOT.release()
        raise
    log.info("iteration %d staged in %.2f s; writing %s in the background", iteration, handle.staged_s,
             handle.artifact_dir)
    return handle


def _write_staged(handle: SaveHandle, box: list[dict[str, Any]], ready: Any, ranks: Ranks,
                  then: Callable[[manifest_record.Manifest], Any] | None) -> None:
    try:
        if ready is not None:
            ready.synchronize()  # the non-blocking device-to-host copies have landed
        testhooks.reached("trainer-async:before-write")
        handle._manifest = write_now(handle.run_dir, handle.iteration, box.pop(), ranks=ranks)
        if then is not None:
            then(handle._manifest)
    except BaseException as exc:  # noqa: BLE001 - raised at result(), the next save or the wait
        box.clear()
        _keep_failure(handle, exc)
    finally:
        _ARENA.keep_used()  # the copy's tensors are gone: its memory waits for the next save
        handle._done.set()
        _SLOT.release()


def _keep_failure(handle: SaveHandle, exc: BaseException) -> None:
    """Keep a background failure in ``handle`` for its report, its frames cleared (kept until reported:
    not the staged copy or the buffers its frames hold), and log it."""
    cause, seen = exc, set()
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        traceback.clear_frames(cause.__traceback__)
        cause = cause.__cause__ or cause.__context__
    handle._fail(exc)
    log.error("%s", handle._error)


def run_in_background(run_dir: Path | str, iteration: int, commit: Callable[[], manifest_record.Manifest], *,
                      then: Callable[[manifest_record.Manifest], Any] | None = None,
                      remedy: str | None = None) -> SaveHandle:
    """Run ``commit()`` (it writes and commits the artifact of ``iteration``, returning its manifest), then
    ``then(manifest)``, on a background thread, as one of this process's saves of ``run_dir``: ``settle``,
    ``wait_for_publications`` and the run's next asynchronous save wait for it and raise its failure
    (``BackgroundSaveFailed``, ``remedy`` when nothing was committed) once. It holds no staged copy: the
    Hugging Face callback's export, which reads the files the Trainer wrote. An earlier background failure
    of the run not yet reported raises here first."""
    run_dir = Path(run_dir)
    _raise_failure(_run_key(run_dir))
    handle = SaveHandle(run_dir, iteration, remedy=remedy)
    with _LOCK:
        _HANDLES.append(handle)
    threading.Thread(target=_run_commit, args=(handle, commit, then), name=f"ckptflow-export-iter{iteration}").start()
    return handle  # not a daemon: an interpreter that exits meanwhile still commits (or refuses) the export


def _run_commit(handle: SaveHandle, commit: Callable[[], manifest_record.Manifest],
                then: Callable[[manifest_record.Manifest], Any] | None) -> None:
    try:
        handle._manifest = commit()
        if then is not None:
            then(handle._manifest)
    except BaseException as exc:  # noqa: BLE001 - raised at result(), the next save or the wait
        _keep_failure(handle, exc)
    finally:
        handle._done.set()


class _Arena:
    """The CPU memory of the last staged copy, kept for the next one: allocating and first touching fresh
    memory costs about twice the copy itself. Used only by the holder of ``_SLOT``; after each save it
    keeps exactly the buffers that save used (the rest is freed), so it never holds more than one copy."""

    def __init__(self) -> None:
        self._free: dict[int, list[Any]] = {}
        self._used: list[Any] = []

    def take(self, nbytes: int) -> Any:
        import torch

        pool = self._free.get(nbytes)
        buf = pool.pop() if pool else torch.UntypedStorage(nbytes)
        self._used.append(buf)
        return buf

    def keep_used(self) -> None:
        self._free = {}
        for buf in self._used:
            self._free.setdefault(buf.nbytes(), []).append(buf)
        self._used = []

    def release(self) -> None:
        self._free, self._used = {}, []


_ARENA = _Arena()


def release_staging_memory() -> None:
    """Free the memory kept from the last asynchronous save's staged copy (after waiting for the save)."""
    with _SLOT:
        _ARENA.release()


_SAVE_GROUP: list[Any] = []


def background_ranks(ranks: Ranks) -> Ranks:
    """The ranks the background thread saves with: alone, or collective over a gloo process group of the
    saves' own (created once, collectively, by every rank's first asynchronous save), so the save's
    agreement and DCP's planning never wait behind, or block, the training's collectives."""
    if not ranks.collective:
        return Ranks()
    if not _SAVE_GROUP:
        _SAVE_GROUP.append(ranks.dist.new_group(backend="gloo", timeout=timedelta(minutes=30)))
    return dataclasses.replace(ranks, group=_SAVE_GROUP[0])


def stage_components(components: Mapping[str, Any], plan: tuple[str, ...],
                     ranks: Ranks | None = None) -> tuple[dict[str, Any], Any]:
    """A copy of what a synchronous save of ``components`` would write, owned by the save: the model's
    state (``write.model_state``), the optimizer's (``write.optimizer_state``), the trainer state; and
    the CUDA event the background thread waits for before writing (None without CUDA tensors)."""
    memo: dict[Any, Any] = {}
    device: list[Any] = []
    model = components["model"]
    staged = {"model": _stage(model_state(model, ranks or Ranks(), to_cpu=False), memo, device)}
    if "optimizer" in plan:
        staged["optimizer"] = _stage(optimizer_state(model, components["optimizer"]), memo, device)
    if "trainer_state" in plan:
        staged["trainer_state"] = _stage(components["trainer_state"], memo, device)
    ready = None
    if device:
        import torch

        ready = torch.cuda.Event()
        ready.record()
    return staged, ready


def _stage(obj: Any, memo: dict[Any, Any], device: list[Any]) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return _stage_tensor(obj, memo, device)
    if isinstance(obj, Mapping):
        out = copy.copy(obj)  # the same mapping type (and attributes) as the original
        for k, v in obj.items():
            out[k] = _stage(v, memo, device)
        return out
    if isinstance(obj, list):
        return [_stage(v, memo, device) for v in obj]
    if isinstance(obj, tuple):
        items = [_stage(v, memo, device) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return copy.deepcopy(obj, memo)


def _stage_tensor(t: Any, memo: dict[Any, Any], device: list[Any]) -> Any:
    import torch

    dtensor = sys.modules.get("torch.distributed.tensor")  # loaded wherever a DTensor exists; never imported here
    if dtensor is not None and isinstance(t, dtensor.DTensor):
        # This rank's shard, staged, under the same spec (mesh, placements, global shape). Built directly:
        # from_local would move a staged CPU shard back onto a CUDA mesh's device.
        return dtensor.DTensor(_stage_tensor(t.to_local(), memo, device), t._spec, requires_grad=False)
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        return copy.deepcopy(t, memo)  # another tensor subclass stages itself
    t = t.detach()
    if t.device.type == "cpu":
        # The storage once, shared as it was: the same bytes torch.save writes for the live tensors.
        storage = t.untyped_storage()
        key = ("storage", storage.data_ptr(), storage.nbytes())
        owned = memo.get(key)
        if owned is None:
            owned = memo[key] = _ARENA.take(storage.nbytes())
            as_bytes = torch.empty((0,), dtype=torch.uint8)
            as_bytes.set_(owned).copy_(torch.empty((0,), dtype=torch.uint8).set_(storage))
        return torch.empty((0,), dtype=t.dtype).set_(owned, t.storage_offset(), t.size(), t.stride())
    # A device tensor becomes what .cpu() makes of it (a synchronous save's copy), in pinned memory,
    # copied without blocking the loop.
    out = torch.empty_like(t, device="cpu", pin_memory=torch.cuda.is_available())
    out.copy_(t, non_blocking=True)
    device.append(t.device)
    return out
