"""The Hugging Face ``Trainer`` (and TRL's trainers built on it): each ``checkpoint-N`` it saves becomes the
artifact ``<run_dir>/checkpoint_artifacts/iter_N``, sealed, and published in the background.

This is the one module of ckptflow that imports transformers (the ``hf`` extra, or ``convert``);
``import ckptflow.trainer`` never loads it. Wiring::

    from ckptflow.trainer import UploadSettings
    from ckptflow.trainer.hf import ArtifactCallback, RunComplete, resume_point

    run_dir = "runs/proj/grp/run1/20261129T000000Z"           # the attempt directory <run>/<ts>
    args = TrainingArguments(output_dir=run_dir, save_steps=100, save_total_limit=2, ...)
    trainer = Trainer(model, args, ..., callbacks=[ArtifactCallback(run_dir, UploadSettings(
        enabled=True, bucket="my-bucket", credentials="creds.json"))])
    try:
        trainer.train(resume_from_checkpoint=resume_point(run_dir))
    except RunComplete:  # a requeue after the last save: its publications caught up, nothing left to train
        pass

At each save (``on_save``, after the Trainer wrote ``checkpoint-N`` and rotated older ones) every process
waits for the others (each rank writes its own ``rng_state_R.pth``); then the main process alone
(``Ranks.decide``: rank 0 of the process group, the process itself without one) exports the checkpoint and
queues its publication on the run's background publisher, as ``save_and_publish`` does; the other ranks never
touch the artifact or the store.

By default (``asynchronous=True``) the export runs off the training loop: ``on_save`` records each file of
``checkpoint-N`` with its identity (``snapshot_checkpoint``: inode, size, modification and change time) and
returns; a background thread (``async_save.run_in_background``) copies and seals it (``copy_and_seal``) and
queues the publication. The Trainer's next save waits for it before it starts: the DefaultFlowCallback sets
``control.should_save`` in ``on_step_end`` / ``on_epoch_end`` before the save, whose ``save_total_limit``
rotation may delete ``checkpoint-N``, so the callback waits there (in ``on_evaluate`` under
``save_strategy="best"``, and in ``on_save`` itself for the last save when the Trainer's end keeps only the
best checkpoint); ``on_train_end`` and ``wait_for_publications`` wait too. A failed background export stops
training at that wait on every rank with the same error (``BackgroundSaveFailed``; ``RankFailed`` under many
ranks, agreed over the saves' own gloo process group, ``async_save.background_ranks``), nothing committed.
A file of ``checkpoint-N`` rewritten, replaced or removed between ``on_save`` and the end of its copy refuses
the export by name (its identity is compared right after its copy), so the artifact holds the bytes the
Trainer saved or is not committed; a change after the copy does not reach the artifact. Not seen: a rewrite of
the same size within the file system's timestamp tick of the Trainer's own write. ``asynchronous=False``
exports inside ``on_save`` (``export_checkpoint``), the loop waiting for the whole copy and seal. A failed
synchronous export stops training on every rank at that save.

Crash points (the background thread): ``hf-export:copying-iter<N>`` (before the ownership record and the first
copy), ``hf-export:copied-iter<N>`` and ``hf-export:before-seal`` (every file copied, checked and fsynced, no
manifest), ``hf-export:after-seal`` (committed, the publication not queued); on the loop
``hf-export:next-save-waits`` (the next save starts waiting for the export). A kill before the seal leaves
``iter_N`` without its manifest; the requeued run resumes from the previous committed artifact
(``resume_point``), and the Trainer's save of N again discards it by its ownership record and exports anew.

``export_checkpoint`` gives every file of ``checkpoint-N`` an inode of its own in ``iter_N`` under the same
relative path (``fsutil.clone_file``: a reflink where the file system offers one, Btrfs or XFS, no byte copied;
else a copy in the kernel, ``copy_file_range``), each fsynced, and seals the directory
(``artifact.seal_artifact``: one component per top-level entry of the checkpoint, a directory as a DCP-format
one), the manifest last. Never a hard link: it shares the inode, and an in-place re-save of ``checkpoint-N``
(``from_pretrained(ckpt).save_pretrained(ckpt)``, any tool that truncates and rewrites a file) would rewrite
the committed artifact's bytes through it, lost for good where the artifact is not archived yet. The cost: a
reflink is a metadata operation; a copy reads and writes the checkpoint once more and holds its bytes twice
until ``save_total_limit`` or ``prune-verified`` frees one of them (measured in docs/trainer.md). It keeps
``write_artifact``'s ownership record (``.save-in-progress``, each entry's identity) so an export killed half
way is discarded and done again by the next save of that iteration, and anything else in the directory is
refused by name.

The artifact holds what ``checkpoint-N`` holds. It is a complete Trainer checkpoint, which
``Trainer.train(resume_from_checkpoint=<iter_N>)`` resumes exactly, when the Trainer saved its full state:
``optimizer.pt``, ``scheduler.pt`` and every rank's ``rng_state*.pth`` beside ``trainer_state.json``
(``save_only_model=False``, the default; ``resume.trainer_checkpoint_missing`` is the rule). Saved with
``save_only_model=True`` it is a model-only artifact: the Trainer would resume it with a fresh optimizer and
scheduler without a word, so nothing resumes a run from it (a new run may start from its weights). The
Trainer's ``save_total_limit`` may delete ``checkpoint-N`` at any later save: the artifact holds its own bytes
until ``prune-verified`` frees them once the archive is proven, so nothing is lost either way.

``resume_point(run_dir)`` is the resume guard's answer (``resume.check_run_attempt``, what ``ckptflow
resume-check --attempt-dir run_dir`` answers): the newest committed artifact when it is a complete Trainer
checkpoint, None for a fresh run, and a refusal naming what is wrong and the remedies otherwise (a model-only
newest artifact, naming the files it lacks; a pruned one, naming ``ckptflow restore``; a damaged one, whose
files are not the bytes its manifest committed).

A save of an iteration that is already committed would collide with its artifact (``export_checkpoint``
refuses a committed ``iter_N``). So at ``on_train_begin`` the callback refuses a start behind the newest
committed artifact (step 0 or an older checkpoint: it would save that iteration again), naming the
artifact to resume from, and a start from a model-only checkpoint (``Trainer.train`` given one directly).
Also at ``on_train_begin``: the preflight of the destination when ``UploadSettings.preflight`` is set
(``preflight_once``, every rank: rank 0 checks), and on the main process the background publication of
every committed artifact without a receipt (``publish_pending``: what a killed attempt left). A start at or
past ``max_steps`` (a requeue of a run killed during its last publication: the resumed ``trainer_state.json``
is at the end) waits for that catch-up and ends there: every rank raises ``RunComplete``, before the Trainer
takes a step (resumed at its end, the Trainer would train one step past ``max_steps`` and save it; it reads
``control.should_training_stop`` only after a step). At ``on_train_end`` every rank waits for the pending
export and the main process for the publications (``wait_at_end``).
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .. import testhooks
from ..artifact import COMPONENT_NAME_RE, ComponentSpec, seal_artifact
from ..errors import NotFound, Refused
from ..fsutil import clone_file, fsync_dir, walk_files
from ..records import manifest as manifest_record
from ..records.receipt import FileIdentity
from .async_save import SaveHandle, background_ranks, run_in_background
from .ownership import Ownership, begin_owned_save
from .preflight import preflight_once
from .publish import UploadSettings, publish_in_background, publish_pending, wait_for_publications
from .ranks import Ranks
from .resume import (
    HF_TRAINER_STATE,
    TRAINER_STATE_FILES,
    check_run_attempt,
    committed_artifacts,
    init_source,
    model_only_reason,
    trainer_checkpoint_missing,
)
from .write import artifact_dir_for

log = logging.getLogger(__name__)

def checkpoint_dir_for(output_dir: Path | str, step: int) -> Path:
    """The Trainer's ``<output_dir>/checkpoint-<step>``."""
    return Path(output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{step}"


def resume_point(run_dir: Path | str) -> str | None:
    """The newest committed artifact of the run, for ``Trainer.train(resume_from_checkpoint=...)``; None when
    the run holds none (a fresh start). The resume guard decides (``resume.check_run_attempt``, the answer of
    ``ckptflow resume-check --attempt-dir run_dir``): a newest artifact that is not a complete Trainer
    checkpoint (saved with ``save_only_model=True``) is refused, naming the files it lacks and the remedies;
    so is one whose payloads are not all on disk (pruned), naming ``ckptflow restore`` (resuming from an older
    one would save the newest again), and one whose files are not the bytes its manifest committed
    (``artifact.changed_payloads``: a stat per file, a hash only of a file modified after the commit), naming
    it damaged and the remedy."""
    decision = check_run_attempt(run_dir, "auto")
    if not decision.may_start:
        raise Refused(decision.message())
    return decision.resume_from


@dataclass(frozen=True)
class CheckpointSnapshot:
    """``checkpoint-N`` as the Trainer left it at ``on_save``: each file (relative, POSIX) and its identity
    (``FileIdentity``: inode, size, modification and change time), to be exported as ``iter_N`` of ``run_dir``."""

    checkpoint_dir: Path
    run_dir: Path
    iteration: int
    files: tuple[tuple[str, FileIdentity], ...]

    @property
    def artifact_dir(self) -> Path:
        return artifact_dir_for(self.run_dir, self.iteration)


def snapshot_checkpoint(checkpoint_dir: Path | str, run_dir: Path | str, iteration: int) -> CheckpointSnapshot:
    """Record every file of ``checkpoint_dir`` with its identity, for ``copy_and_seal``; a missing or empty
    checkpoint and a committed ``iter_N`` are refused here, before anything is written."""
    ckpt = Path(checkpoint_dir)
    if not ckpt.is_dir():
        raise NotFound(f"checkpoint directory {ckpt} does not exist",
                       remedy="export a checkpoint the Trainer saved (its output_dir/checkpoint-N)")
    files = list(walk_files(ckpt))  # regular files only: a symlink is refused by name
    if not files:
        raise NotFound(f"checkpoint directory {ckpt} holds no file", remedy="export a checkpoint the Trainer saved")
    art = artifact_dir_for(run_dir, iteration)
    manifest_path = manifest_record.path_in(art)
    if manifest_path.exists() or manifest_path.is_symlink():
        raise Refused(f"{art} is already a committed artifact ({manifest_path.name} present); it is never overwritten "
                      f"by {ckpt}", remedy=f"resume training from {art} (resume_from_checkpoint) rather than from an "
                      "older checkpoint, or train under a new run directory")
    return CheckpointSnapshot(ckpt, Path(run_dir), iteration, tuple((rel, FileIdentity.of(ckpt / rel)) for rel in files))


def copy_and_seal(snapshot: CheckpointSnapshot) -> manifest_record.Manifest:
    """Reflink or copy (never hard-link) every file of the snapshot into ``iter_N`` and seal it, the manifest
    last; returns the manifest. Each file's identity is compared with the snapshot's right after its copy: a
    file rewritten, replaced or removed since the snapshot (before or during its copy) refuses the export by
    name, nothing committed (a change after its copy is not the artifact's: the copy holds the bytes of the
    snapshot). A committed ``iter_N`` is refused (``begin_owned_save``: its manifest is no entry of an
    interrupted export), never overwritten."""
    art, iteration = snapshot.artifact_dir, snapshot.iteration
    testhooks.reached(f"hf-export:copying-iter{iteration}")
    owned = begin_owned_save(art)
    try:
        return _copy_and_seal(snapshot, owned)
    finally:
        owned.ended()


def _copy_and_seal(snapshot: CheckpointSnapshot, owned: Ownership) -> manifest_record.Manifest:
    ckpt, art, iteration = snapshot.checkpoint_dir, snapshot.artifact_dir, snapshot.iteration
    dirs: list[str] = []
    made: dict[str, int] = {}
    for rel, seen in snapshot.files:
        for parent in reversed(PurePosixPath(rel).parents[:-1]):
            if parent.as_posix() not in dirs:
                (art / parent).mkdir()
                owned.created(parent.as_posix(), writing=True)
                dirs.append(parent.as_posix())
        try:
            how = _own_copy(ckpt / rel, art / rel, owned, rel)
            now = FileIdentity.of(ckpt / rel)
        except FileNotFoundError:
            now = None
        if now != seen:
            what = "was removed" if now is None else "changed (rewritten or replaced)"
            raise Refused(f"{ckpt / rel} {what} after the Trainer saved it, before its copy into {art} was complete; "
                          "the copy is not the checkpoint the Trainer saved, and is not committed",
                          remedy=f"leave {ckpt} as the Trainer wrote it until iteration {iteration} is committed "
                                 "(ArtifactCallback(..., asynchronous=False) exports it inside on_save)")
        made[how] = made.get(how, 0) + 1
    log.info("%s: %s from %s", art, ", ".join(f"{n} file(s) {'reflinked' if how == 'reflink' else 'copied'}"
                                           for how, n in sorted(made.items())), ckpt)
    for d in dirs:
        fsync_dir(art / d)
    fsync_dir(art)
    testhooks.reached(f"hf-export:copied-iter{iteration}")
    testhooks.reached("hf-export:before-seal")
    tops = sorted({rel.split("/")[0] for rel, _ in snapshot.files})
    specs = [ComponentSpec(name=_component_name(top), path=top) for top in tops]
    return seal_artifact(art, iteration, specs, progress=False, before_commit=owned.release)


def export_checkpoint(checkpoint_dir: Path | str, run_dir: Path | str, iteration: int) -> manifest_record.Manifest:
    """Reflink or copy (never hard-link) every file of ``checkpoint_dir`` into the run's ``iter_N`` and seal it,
    the manifest last; returns the manifest (``snapshot_checkpoint`` then ``copy_and_seal``, here and now). A
    committed ``iter_N`` is refused, never overwritten."""
    return copy_and_seal(snapshot_checkpoint(checkpoint_dir, run_dir, iteration))


def _own_copy(src: Path, dst: Path, owned, rel: str) -> str:
    """``dst`` a new file (exclusive) holding ``src``'s bytes in an inode of its own (``fsutil.clone_file``:
    a reflink, else a copy), fsynced, recorded with its identity; returns how it was made."""
    how = clone_file(src, dst, on_created=lambda: owned.created(rel, writing=True))
    owned.created(rel, writing=False)  # complete: its inode, size and times are the proof
    return how


def _component_name(entry: str) -> str:
    return entry if COMPONENT_NAME_RE.match(entry) else re.sub(r"[^A-Za-z0-9_.-]", "_", entry)


def refuse_a_start_behind(run_dir: Path | str, step: int) -> None:
    """Refuse a start at ``step`` behind the run's newest committed artifact (the Trainer would save a
    committed iteration again, and its export would be refused)."""
    found = committed_artifacts(Path(run_dir))
    if found and max(found) > step:
        newest = found[max(found)]
        start = "at step 0" if step == 0 else f"from step {step}"
        raise Refused(f"refusing to train {start} in {run_dir}: the committed artifact {newest} is newer, and a "
                      "save of its iteration would collide with it", remedy=f"resume from {newest} "
                      "(Trainer.train(resume_from_checkpoint=ckptflow.trainer.hf.resume_point(run_dir))), or train "
                      "under a new run directory")


def refuse_a_model_only_start(run_dir: Path | str, output_dir: Path | str, step: int) -> None:
    """Refuse a start at ``step`` > 0 resumed from a model-only checkpoint: the run's committed ``iter_<step>``
    (or, where none is committed, the Trainer's own ``checkpoint-<step>``) lacks the optimizer, scheduler or
    RNG state (``resume.trainer_checkpoint_missing``), so the Trainer restarted them fresh."""
    if step <= 0:
        return
    found = committed_artifacts(Path(run_dir))
    if step in found:
        source, why = found[step], model_only_reason(found[step])
    else:
        source = checkpoint_dir_for(output_dir, step)
        if not (source / HF_TRAINER_STATE).is_file() or not (missing := trainer_checkpoint_missing(os.listdir(source))):
            return
        why = (f"{source} is a model-only checkpoint (saved with save_only_model=True: no {', '.join(missing)}): "
               "resumed from it, the Trainer restarted the optimizer, the learning-rate schedule and the RNG streams")
    if why:
        model = init_source(source) if step in found else f"{source} (from_pretrained)"
        raise Refused(f"refusing to train {run_dir} from step {step}: {why}", remedy=(
            f"save the full Trainer state (save_only_model=False, the default: {TRAINER_STATE_FILES}) for runs that "
            f"must resume exactly; or start a NEW run (a new run directory, step 0) initialised from {model}"))


class RunComplete(Refused):
    """A start at or past ``max_steps`` (a requeue of a run that had saved its last step): the publications it
    left were caught up, and nothing is trained. Raised by ``on_train_begin`` on every rank, before the Trainer
    takes a step; a requeued job catches it around ``trainer.train`` and ends as a finished one."""

    def __init__(self, message: str, *, remedy: str | None = None, published: list[str] | None = None,
                 failed: list[str] | None = None):
        super().__init__(message, remedy=remedy)
        self.published, self.failed = published or [], failed or []


class ArtifactCallback(TrainerCallback):
    """Turns every ``checkpoint-N`` the Trainer saves into the sealed artifact ``iter_N`` of ``run_dir``
    (default: the Trainer's ``output_dir``) and publishes it in the background when ``upload`` is enabled.
    ``asynchronous`` (default): ``on_save`` records the checkpoint's files and returns, the copy and the seal
    run on a background thread, and the Trainer's next save (``on_step_end`` / ``on_epoch_end`` with
    ``should_save``, ``on_evaluate`` under ``save_strategy="best"``) and ``on_train_end`` wait for it;
    ``asynchronous=False``: ``on_save`` exports the checkpoint itself, the loop waiting."""

    def __init__(self, run_dir: Path | str | None = None, upload: UploadSettings | None = None, *,
                 wait_at_end: bool = True, asynchronous: bool = True):
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.upload = upload or UploadSettings()
        self.wait_at_end = wait_at_end
        self.asynchronous = asynchronous
        self.exported: list[int] = []
        self._pending: int | None = None  # the iteration whose export runs in the background (every rank)
        self._handle: SaveHandle | None = None  # its background export (the main process)

    def _run(self, args) -> Path:
        return self.run_dir if self.run_dir is not None else Path(args.output_dir)

    def on_train_begin(self, args, state, control, **kwargs):
        run_dir, step = self._run(args), state.global_step
        ranks = Ranks.current()

        def check_the_start() -> None:
            refuse_a_start_behind(run_dir, step)
            refuse_a_model_only_start(run_dir, args.output_dir, step)
            if args.save_only_model:
                log.warning("%s: save_only_model=True: every artifact of this run is model-only (no %s), and no "
                            "requeue can resume from it; resume_point refuses it", run_dir, TRAINER_STATE_FILES)

        ranks.decide(f"the start of {run_dir} at step {step}", check_the_start)
        if self.upload.enabled and self.upload.preflight:
            preflight_once(run_dir, self.upload)  # every rank: rank 0 checks, the outcome is broadcast
        if ranks.is_main:
            publish_pending(run_dir, self.upload, collective=False)  # what a killed attempt left unpublished
        if state.max_steps > 0 and step >= state.max_steps:
            control.should_training_stop = True
            self._end_at_once(run_dir, step, state.max_steps, ranks)

    def _end_at_once(self, run_dir: Path, step: int, max_steps: int, ranks: Ranks) -> None:
        """A start at or past ``max_steps``: wait for the catch-up's publications (main process; unless
        ``wait_at_end`` is off), then raise ``RunComplete`` on every rank; the Trainer never reads
        ``should_training_stop`` before a step."""
        def catch_up() -> tuple[list[str], list[str]]:
            waited = self.upload.enabled and self.wait_at_end
            outcomes = wait_for_publications(run_dir, collective=False) if waited else []
            return ([o.artifact_dir.name for o in outcomes if o.ok], [o.artifact_dir.name for o in outcomes if not o.ok])

        published, failed = ranks.decide(f"the catch-up of {run_dir} at its last step", catch_up)
        if self.upload.enabled and not self.wait_at_end:
            caught = "its publications are queued in the background (wait_at_end=False: wait_for_publications waits)"
        else:
            caught = (f"its publications are caught up ({', '.join(published) or 'none was pending'}"
                      + (f"; failed, each logged with its retry command: {', '.join(failed)}" if failed else "") + ")")
        message = (f"{run_dir} is already at step {step} of max_steps={max_steps} (the trainer_state.json it resumed "
                   f"from): {caught}; training ends here, before any step")
        if ranks.is_main:
            log.warning("%s", message)
        raise RunComplete(message, published=published, failed=failed, remedy=(
            "nothing is left to train: a requeued job catches ckptflow.trainer.hf.RunComplete around trainer.train "
            "and ends as a finished one; raise max_steps to train further"))

    def on_save(self, args, state, control, **kwargs):
        ranks, step = Ranks.current(), state.global_step
        ckpt, run_dir = checkpoint_dir_for(args.output_dir, step), self._run(args)
        ranks.settle(f"the save of {ckpt}", None)  # every rank's files of the checkpoint are written

        def publish(_manifest=None) -> None:
            testhooks.reached("hf-export:after-seal")
            publish_in_background(run_dir, artifact_dir_for(run_dir, step), self.upload)

        if not self.asynchronous:
            ranks.decide(f"the export of {ckpt}", lambda: publish(export_checkpoint(ckpt, run_dir, step)))
            self.exported.append(step)
            return
        self._wait_for_export()  # a save nothing announced (a custom save): its export waits here at the latest

        def start() -> None:
            snapshot = snapshot_checkpoint(ckpt, run_dir, step)
            self._handle = run_in_background(
                run_dir, step, lambda: copy_and_seal(snapshot), then=publish,
                remedy=f"fix the cause, then resume from the newest committed artifact (resume_point) so that the "
                       f"Trainer saves {ckpt} again; its export discards the uncommitted {snapshot.artifact_dir} "
                       "by its ownership record")

        background_ranks(ranks).decide(f"the export of {ckpt}", start)
        self._pending = step
        if args.save_total_limit == 1 and state.best_model_checkpoint is not None and (
                control.should_training_stop or state.global_step >= state.max_steps):
            self._wait_for_export()  # the Trainer's end removes every checkpoint but the best before on_train_end

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save:  # set by the DefaultFlowCallback: the save (and its rotation) comes next
            self._wait_for_export()

    def on_epoch_end(self, args, state, control, **kwargs):
        if control.should_save:
            self._wait_for_export()

    def on_evaluate(self, args, state, control, **kwargs):
        if args.save_strategy == "best":  # a save may follow the evaluation, decided by its metric
            self._wait_for_export()

    def _wait_for_export(self) -> None:
        """Every rank: wait for the background export (the main process's), before the Trainer's next save may
        rotate checkpoint-N away; its failure raises on every rank alike (``RankFailed`` under many ranks),
        agreed over the saves' own gloo group. Nothing pending (the same on every rank): nothing to do."""
        step, handle = self._pending, self._handle
        if step is None:
            return
        self._pending = self._handle = None
        ranks = Ranks.current()

        def wait() -> None:
            testhooks.reached("hf-export:next-save-waits", f"iter{step}")
            handle.result()  # BackgroundSaveFailed, naming the iteration and the cause

        background_ranks(ranks).decide(f"the export of checkpoint-{step}", wait)
        self.exported.append(step)

    def on_train_end(self, args, state, control, **kwargs):
        self._wait_for_export()
        if self.wait_at_end and Ranks.current().is_main and self.upload.enabled:
            wait_for_publications(self._run(args))  # each failure was logged with its retry command
