"""The resume guard: no cold restart over a committed artifact.

``pin_run_attempt(attempt_dir, resume, resume_path)`` decides, before a training job writes anything,
whether it may start in the attempt directory ``<run>/<ts>`` and from where:

- ``resume="auto"`` resumes from the newest resumable candidate: a complete full checkpoint under
  ``checkpoints/`` (an ``iter_N`` directory holding ``trainer.pt`` and no ``.save-in-progress`` marker, see
  ``checkpoints.py``: a save whose shards are still coming is not a candidate), an artifact committed
  with the full component plan (model, optim, trainer), or a complete Hugging Face Trainer checkpoint
  exported by ``trainer.hf`` (``trainer_state.json`` with the optimizer, scheduler and RNG state beside it,
  ``trainer_checkpoint_missing``). It never resumes from a model-only artifact: a native one without
  optim/trainer, or a Trainer checkpoint saved with ``save_only_model=True`` (refused naming what it lacks);
- when the attempt holds committed ``checkpoint_artifacts/iter_*`` (manifest present), a step-0 restart is
  refused, and so is a candidate behind the newest committed artifact: resuming it would replay up to
  that artifact and collide with it one save later (under Slurm requeue, in a loop);
- an explicit ``resume_path`` (``judge_resume_path``) must exist and is judged by its real path (``..`` and
  symlinks resolved), never by a name segment: a committed full-plan artifact directory (iteration from
  its manifest, its ``trainer.pt`` readable and agreeing; for a complete Trainer checkpoint the
  ``global_step`` of its ``trainer_state.json``), a complete checkpoint directory, or a
  single-file checkpoint outside any ``iter_N`` directory; the iteration comes from the validated trainer
  state (``optimizer_step``/``iter`` in ``trainer.pt``, or at the top level of a single-file checkpoint,
  loaded with ``weights_only=True``). A file or directory inside a model-only artifact (or inside any
  ``iter_N`` directory), a missing path, a save without ``trainer.pt`` or still in progress, and a state
  whose iteration cannot be established or contradicts the directory's are refused by name;
- a full-plan artifact whose payload files are not all on disk (pruned: its manifest and receipt left) is
  no resume point until it is restored, whether ``auto`` finds it or ``resume_path`` names it: both refuse,
  naming ``ckptflow restore`` as the first remedy (``unrestored``); a complete checkpoint of the same
  iteration is resumed instead;
- an artifact chosen or named as the resume point whose files are not the bytes its manifest committed
  (``artifact.changed_payloads``: a file of another size, or one rewritten in place after the commit) is
  refused as damaged, naming the remedy (``artifact.changed_remedy``);
- a fresh attempt, and an interrupted artifact directory without its manifest, are unaffected;
- ``resume="off"`` starts in the attempt directory when it holds nothing, else mints a fresh attempt beside it.

``check_run_attempt`` only looks: it never creates a directory (``ckptflow resume-check`` under
``--resume off`` names the fresh attempt it would mint, and running it twice names the same one);
``pin_run_attempt`` is the one that creates the minted attempt, exclusively.

A refusal names the attempt directory and three remedies, each an operator decision (``remedies``), each
naming files that exist: the model to initialise a new run from is the newest artifact's model file (a
Trainer checkpoint: the artifact directory itself, a Hugging Face model or adapter directory), restored
first where it was pruned.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..artifact import ARTIFACTS_DIR, ITER_DIR_RE, changed_payloads, changed_remedy
from ..errors import InvalidRecord, Refused, UsageError
from ..fsutil import require_directory
from ..records import manifest as manifest_record
from .checkpoints import CHECKPOINTS_DIR, is_complete_checkpoint, iteration_of_name
from .ownership import IN_PROGRESS
from .ranks import Ranks
from .write import TRAINER_FILE

FULL_PLAN = frozenset({"model", "optim", "trainer"})


def restore_remedy(artifact_dir: Path, iteration: int) -> str:
    return (f"restore the artifact's payloads from its archive first: `ckptflow restore --artifact-dir {artifact_dir}` "
            f"(in the workflow: `snakemake restore --config iter={iteration}`), then resume from it")


def remedies(attempt_dir: Path, newest: Path | None) -> list[str]:
    if newest is not None and trainer_artifact_missing(newest) is not None:
        return [
            f"continue from the artifact as a NEW run: a new run directory, the model initialised from "
            f"{init_source(newest)}, the data advanced past the examples it consumed, fresh optimizer state",
            f"train under a new run directory (ckptflow resume-check --resume off names a fresh attempt beside "
            f"{attempt_dir})",
            f"save the full Trainer state when exact resume across requeues is required: save_only_model=False (the "
            f"default) writes {TRAINER_STATE_FILES} into every checkpoint",
        ]
    model = init_source(newest) if newest is not None else "the committed model artifact (checkpoint_artifacts/iter_N/model.pt)"
    return [
        f"continue from the artifact as a NEW run: a new job name, init from {model}, advance the data cursor by "
        "the exact number of consumed examples, fresh optimizer state",
        f"set resume=off (ckptflow resume-check --resume off) to mint a fresh attempt beside {attempt_dir}",
        "save the full component plan [model, optimizer, trainer_state] when exact resume across requeues is required",
    ]


def init_source(artifact_dir: Path) -> str:
    """What a new run initialises its model from, named by files the artifact holds: a Trainer checkpoint's
    directory (``from_pretrained``; a LoRA one: its adapter over the base it was trained on), else the file of
    its ``model`` component; a pruned one is restored first."""
    try:
        manifest = manifest_record.read_manifest(artifact_dir)
    except (InvalidRecord, OSError):
        return f"{artifact_dir} (its manifest cannot be read: judge it before using it)"
    entries = _top_entries(manifest)
    if HF_TRAINER_STATE in entries:
        source = (f"{artifact_dir} (a LoRA adapter: PeftModel.from_pretrained(base, \"{artifact_dir}\") over the base "
                  "it was trained on)" if "adapter_config.json" in entries else
                  f"{artifact_dir} (a Hugging Face model directory: from_pretrained(\"{artifact_dir}\"))")
    elif (model := manifest.components.get("model")) is not None:
        source = f"{artifact_dir}/{model.path}"
    else:
        source = f"{artifact_dir} (it has no model component: {', '.join(sorted(manifest.components))})"
    if gone := unrestored(artifact_dir):
        return f"{source}, once `ckptflow restore --artifact-dir {artifact_dir}` put back its {len(gone)} pruned file(s)"
    return source


# A Hugging Face Trainer checkpoint (``checkpoint-N``, and the artifact ``trainer.hf`` exports from it): the Trainer
# writes ``trainer_state.json`` at every save; the optimizer, scheduler and RNG state only without save_only_model.
HF_TRAINER_STATE = "trainer_state.json"
TRAINER_STATE_FILES = "optimizer.pt, scheduler.pt and rng_state.pth (rng_state_<rank>.pth per rank)"
_RNG_STATE_RE = re.compile(r"rng_state(?:_(\d+))?\.pth$")


def trainer_checkpoint_missing(entries: Iterable[str]) -> list[str]:
    """What a Hugging Face Trainer checkpoint whose top-level entries are ``entries`` lacks for an exact resume,
    [] when nothing: the optimizer state (``optimizer.pt``; FSDP's ``optimizer*`` directory or file; DeepSpeed's
    ``global_step*`` directory, which holds the scheduler too), the scheduler state (``scheduler.pt``) and every
    rank's RNG state (``rng_state.pth``, or ``rng_state_<rank>.pth`` for ranks 0..n-1). Saved with
    ``save_only_model=True`` it holds none of them: ``Trainer.train(resume_from_checkpoint=...)`` then starts
    them fresh without a word (the learning rate back at its first value), and the run diverges."""
    names = set(entries)
    deepspeed = any(n.startswith("global_step") for n in names)
    missing = []
    if not deepspeed and not any(n.startswith("optimizer") or n.endswith("-optimizer.pt") for n in names):
        missing.append("optimizer.pt")
    if not deepspeed and "scheduler.pt" not in names:
        missing.append("scheduler.pt")
    ranks = {int(m.group(1)) for n in names if (m := _RNG_STATE_RE.match(n)) and m.group(1) is not None}
    if "rng_state.pth" not in names and not ranks:
        missing.append("rng_state.pth")
    elif ranks and (gaps := sorted(set(range(max(ranks) + 1)) - ranks)):
        missing.extend(f"rng_state_{r}.pth" for r in gaps)
    return missing


def trainer_artifact_missing(artifact_dir: Path) -> list[str] | None:
    """``trainer_checkpoint_missing`` of an artifact exported from a Trainer checkpoint (it commits
    ``trainer_state.json``), judged by its manifest (so a pruned artifact is judged too); None for any
    other artifact, or one whose manifest cannot be read."""
    try:
        entries = _top_entries(manifest_record.read_manifest(artifact_dir))
    except (InvalidRecord, OSError):
        return None
    return trainer_checkpoint_missing(entries) if HF_TRAINER_STATE in entries else None


def _top_entries(manifest: manifest_record.Manifest) -> set[str]:
    return {c.path.split("/")[0] for c in manifest.components.values()}


def model_only_reason(artifact_dir: Path, shown: str | None = None) -> str | None:
    """Why a committed artifact is no resume point, or None when it is one (full plan, or a complete Trainer
    checkpoint)."""
    shown = shown or str(artifact_dir)
    if (missing := trainer_artifact_missing(artifact_dir)) is not None:
        if not missing:
            return None
        return (f"{shown} is a model-only artifact (a Trainer checkpoint saved with save_only_model=True: no "
                f"{', '.join(missing)}): resumed from it, the Trainer would restart the optimizer, the learning-rate "
                "schedule and the RNG streams, and the run would diverge")
    if is_full_plan_artifact(artifact_dir):
        return None
    return f"resume=auto never resumes from a model-only artifact ({shown})"


def is_resumable_artifact(artifact_dir: Path) -> bool:
    """A committed artifact a run resumes from exactly: the full component plan, or a complete Trainer checkpoint."""
    return model_only_reason(artifact_dir) is None


@dataclass
class ResumeDecision:
    decision: str  # "fresh" (start at step 0), "resume" (from resume_from) or "refused"
    reason: str
    attempt_dir: str  # where the job runs (a minted sibling under resume=off)
    original_attempt_dir: str
    resume: str
    resume_from: str | None = None
    resume_iteration: int | None = None
    newest_artifact: str | None = None
    newest_artifact_iteration: int | None = None
    remedies: list[str] = field(default_factory=list)

    @property
    def may_start(self) -> bool:
        return self.decision != "refused"

    def message(self) -> str:
        lines = [f"refusing to start in attempt directory {self.original_attempt_dir}: {self.reason}",
                 "remedies (each an operator decision):"]
        return "\n".join(lines + [f"  {i}. {r}" for i, r in enumerate(self.remedies, 1)])

    def to_report(self) -> dict[str, Any]:
        return {"status": "may-start" if self.may_start else "refused", **asdict(self)}


def _iterations(root: Path, complete: Callable[[Path], bool]) -> dict[int, Path]:
    """The ``iter_N`` directories under ``root`` that ``complete`` accepts, by iteration."""
    found: dict[int, Path] = {}
    if root.is_dir():
        for d in root.iterdir():
            m = ITER_DIR_RE.match(d.name)
            if m and complete(d):
                found[int(m.group(1))] = d
    return dict(sorted(found.items()))


def committed_artifacts(attempt_dir: Path) -> dict[int, Path]:
    """Every ``checkpoint_artifacts/iter_N`` holding its manifest (interrupted saves are ignored)."""
    return _iterations(attempt_dir / ARTIFACTS_DIR, lambda d: d.is_dir() and manifest_record.path_in(d).is_file())


def resumable_checkpoints(attempt_dir: Path) -> dict[int, Path]:
    """Complete full checkpoints under ``checkpoints/`` (``checkpoints.is_complete_checkpoint``)."""
    return _iterations(attempt_dir / CHECKPOINTS_DIR, is_complete_checkpoint)


def is_full_plan_artifact(artifact_dir: Path) -> bool:
    try:
        return FULL_PLAN <= set(manifest_record.read_manifest(artifact_dir).components)
    except (InvalidRecord, OSError):
        return False


def unrestored(artifact_dir: Path) -> list[str]:
    """The payload files the manifest of ``artifact_dir`` names that are not on disk (a pruned artifact: all
    of them); [] when every one is there, or when the manifest cannot be read (judged elsewhere)."""
    try:
        manifest = manifest_record.read_manifest(artifact_dir)
    except (InvalidRecord, OSError):
        return []
    return sorted(e.path for e in manifest.physical_files() if not os.path.lexists(artifact_dir / e.path))


class _Unrestored(Exception):
    """A full-plan artifact chosen or named as the resume point lacks payload files (``unrestored``)."""

    def __init__(self, artifact_dir: Path, iteration: int, gone: list[str]):
        super().__init__(str(artifact_dir))
        self.artifact_dir, self.iteration, self.gone = artifact_dir, iteration, gone


class _Damaged(Exception):
    """An artifact chosen or named as the resume point is not the bytes its manifest committed
    (``artifact.changed_payloads``)."""

    def __init__(self, artifact_dir: Path, changed: list[str]):
        super().__init__(str(artifact_dir))
        self.artifact_dir, self.changed = artifact_dir, changed


def _refuse_damaged(artifact_dir: Path) -> None:
    if changed := changed_payloads(artifact_dir):
        raise _Damaged(artifact_dir, changed)


def judge_resume_path(path: Path | str) -> tuple[Path | None, int | None, str]:
    """(real path, iteration, how it was established) of an explicit resume path, or (None, None, why not);
    raises ``_Unrestored`` for a full-plan artifact whose payloads are not all on disk, ``_Damaged`` for one
    whose files are not the bytes its manifest committed."""
    given = Path(path)
    if not os.path.lexists(given):
        return None, None, f"{given} does not exist"
    try:
        real = given.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        return None, None, f"{given} does not resolve to an existing path ({exc})"
    shown = f"{given}" + (f" (real path {real})" if real != given.absolute() else "")
    parts = real.parts
    for i in range(len(parts) - 1):
        if parts[i] == ARTIFACTS_DIR and iteration_of_name(parts[i + 1]) is not None:
            art = Path(*parts[: i + 2])
            if real != art:
                return None, None, (f"{shown} is inside the artifact {art}, not a resumable checkpoint: a file or "
                                    "directory of an artifact is never a resume point (pass the artifact directory "
                                    "of a full-plan artifact, or a checkpoint directory)")
            return _judge_artifact(art, shown)
    if real.is_dir():
        return _judge_checkpoint_dir(real, shown)
    if real.is_file():
        if iteration_of_name(real.parent.name) is not None:
            return None, None, (f"{shown} is a file inside the checkpoint directory {real.parent}: pass the directory "
                                "itself, which holds the whole resumable state")
        return _with_state(real, real, None)
    return None, None, f"{shown} is neither a file nor a directory"


def _judge_artifact(art: Path, shown: str) -> tuple[Path | None, int | None, str]:
    if not manifest_record.path_in(art).is_file():
        return None, None, f"{shown} is an artifact directory without its manifest (an interrupted save)"
    if why := model_only_reason(art, shown):
        return None, None, why
    it = manifest_record.read_manifest(art).iteration
    if gone := unrestored(art):
        raise _Unrestored(art, it, gone)
    _refuse_damaged(art)
    if trainer_artifact_missing(art) is not None:
        return _with_trainer_state(art, it)
    return _with_state(art, art / TRAINER_FILE, it)


def _with_trainer_state(art: Path, expected: int) -> tuple[Path | None, int | None, str]:
    """The ``global_step`` of a Trainer checkpoint's ``trainer_state.json``; it must agree with the manifest."""
    source = art / HF_TRAINER_STATE
    try:
        state = json.loads(source.read_bytes())  # the Trainer's own file (it may hold NaN): not a ckptflow record
        step = state["global_step"]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        return None, None, f"its iteration cannot be established: {source} has no readable global_step ({exc})"
    if not isinstance(step, int) or isinstance(step, bool) or step != expected:
        return None, None, (f"the trainer state in {source} (global_step={step!r}) says another step than the "
                            f"manifest's iteration {expected}")
    return art, step, f"the trainer state in {source} (global_step={step})"


def _judge_checkpoint_dir(real: Path, shown: str) -> tuple[Path | None, int | None, str]:
    if os.path.lexists(real / IN_PROGRESS):
        return None, None, f"{shown} holds {IN_PROGRESS}: its save is in progress or was interrupted"
    if not (real / TRAINER_FILE).is_file() or (real / TRAINER_FILE).is_symlink():
        return None, None, f"{shown} has no {TRAINER_FILE}: an interrupted save or not a resumable checkpoint"
    return _with_state(real, real / TRAINER_FILE, iteration_of_name(real.name))


def _with_state(real: Path, source: Path, expected: int | None) -> tuple[Path | None, int | None, str]:
    """The iteration of ``source``'s trainer state; it must agree with ``expected`` (name or manifest)."""
    it, how = _iteration_from_trainer_state(source)
    if it is None:
        return None, None, f"its iteration cannot be established: {how}"
    if expected is not None and it != expected:
        return None, None, f"{how} says iteration {it}, but {real} stands for iteration {expected}"
    return real, it, how


def _iteration_from_trainer_state(source: Path) -> tuple[int | None, str]:
    import torch

    try:
        state = torch.load(source, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable or unsafe pickle is "cannot be established"
        return None, f"{source} cannot be loaded safely (weights_only): {type(exc).__name__}: {exc}"
    if not isinstance(state, dict):
        return None, f"{source} holds a {type(state).__name__}, not a trainer state mapping"
    values = {k: state[k] for k in ("iter", "optimizer_step") if k in state}
    bad = {k: v for k, v in values.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
    if not values or bad:
        return None, f"{source} has no valid optimizer_step/iter at its top level (found {sorted(values) or 'neither'})"
    it = values.get("iter", values.get("optimizer_step"))
    return it, f"the trainer state in {source} ({', '.join(f'{k}={v}' for k, v in sorted(values.items()))})"


def check_run_attempt(attempt_dir: Path | str, resume: str = "auto", resume_path: Path | str | None = None, *,
                      must_exist: bool = False) -> ResumeDecision:
    """The decision, without raising on a refusal (``pin_run_attempt`` raises) and without creating
    anything. ``must_exist`` (the command line): an attempt directory that does not exist is a mistyped
    path (``NotFound``), not a fresh attempt; the trainer passes a new attempt's directory before it exists."""
    if resume not in ("auto", "off"):
        raise UsageError(f"resume={resume!r} is not auto or off")
    attempt = Path(attempt_dir).absolute()
    if must_exist:
        require_directory(attempt, "attempt directory", f"pass an existing <run>/<ts> directory, or create it "
                          f"(mkdir -p {attempt}) to start a new attempt there")
    artifacts = committed_artifacts(attempt)
    newest_it, newest = (next(reversed(artifacts.items())) if artifacts else (None, None))
    base = {"attempt_dir": str(attempt), "original_attempt_dir": str(attempt), "resume": resume,
            "newest_artifact": str(newest) if newest else None, "newest_artifact_iteration": newest_it}

    def refuse(reason: str) -> ResumeDecision:
        return ResumeDecision("refused", reason, remedies=remedies(attempt, newest), **base)

    def refuse_unrestored(point: _Unrestored) -> ResumeDecision:
        gone = point.gone
        reason = (f"the resume point {point.artifact_dir} (iteration {point.iteration}) is pruned: {len(gone)} of its "
                  f"payload files ({', '.join(gone[:3])}{', ...' if len(gone) > 3 else ''}) are not on disk, so its "
                  "trainer state cannot be read until the artifact is restored")
        return ResumeDecision("refused", reason, remedies=[restore_remedy(point.artifact_dir, point.iteration),
                                                           *remedies(attempt, newest)], **base)

    def refuse_damaged(point: _Damaged) -> ResumeDecision:
        changed = point.changed
        reason = (f"the resume point {point.artifact_dir} is damaged: {'; '.join(changed[:3])}"
                  f"{f' (+{len(changed) - 3} more)' if len(changed) > 3 else ''}; it is not the state its manifest "
                  "committed")
        return ResumeDecision("refused", reason, remedies=[changed_remedy(point.artifact_dir),
                                                           *remedies(attempt, newest)], **base)

    if resume == "off":
        return _mint_fresh(attempt, base)
    if resume_path is not None:
        try:
            real, it, how = judge_resume_path(resume_path)
        except _Unrestored as point:
            return refuse_unrestored(point)
        except _Damaged as point:
            return refuse_damaged(point)
        if real is None:
            if "model-only" in how:
                return refuse(how)
            return refuse(f"resume path {resume_path} is not a resumable checkpoint: {how}; nothing proves it is "
                          "at or beyond the newest committed artifact")
        cand = real
    else:
        full = {i: d for i, d in artifacts.items() if is_resumable_artifact(d)}
        pruned = {i: gone for i, d in full.items() if (gone := unrestored(d))}
        # A complete checkpoint of an iteration stands in for its pruned artifact.
        cands = {**resumable_checkpoints(attempt), **{i: d for i, d in full.items() if i not in pruned}}
        if pruned and max(pruned) > max(cands, default=-1):
            return refuse_unrestored(_Unrestored(full[max(pruned)], max(pruned), pruned[max(pruned)]))
        if not cands:
            if newest is None:
                return ResumeDecision("fresh", "a fresh attempt: no committed artifact, no resumable checkpoint", **base)
            return refuse(f"it holds committed artifact {newest} and nothing resumable{_why_not(newest)}: a step-0 "
                          f"restart would collide with iteration {newest_it} at its first save")
        it = max(cands)
        cand, how = cands[it], f"the newest resumable checkpoint {cands[it]}"
        if cand in full.values():
            try:
                _refuse_damaged(cand)
            except _Damaged as point:
                return refuse_damaged(point)
    if newest_it is not None and it < newest_it:
        return refuse(f"the resume point {cand} (iteration {it}, from {how}) is behind the committed artifact "
                      f"{newest} (iteration {newest_it}){_why_not(newest)}: resuming would replay up to it and collide "
                      "one save later")
    return ResumeDecision("resume", f"resume from iteration {it} ({how})", resume_from=str(cand),
                          resume_iteration=it, **base)


def _why_not(newest: Path) -> str:
    """`` (<why the newest artifact is no resume point>)`` for a model-only Trainer checkpoint (naming what it
    lacks), else ""."""
    if trainer_artifact_missing(newest) and (why := model_only_reason(newest, "it")):
        return f" ({why})"
    return ""


def _mint_fresh(attempt: Path, base: dict[str, Any]) -> ResumeDecision:
    if not attempt.exists() or not any(attempt.iterdir()):
        return ResumeDecision("fresh", "resume=off in an empty attempt directory", **base)
    sibling = _free_sibling(attempt)
    return ResumeDecision("fresh", _minted_reason(sibling, attempt, created=False), **{**base, "attempt_dir": str(sibling)})


def _minted_reason(sibling: Path, attempt: Path, *, created: bool) -> str:
    what = "a fresh attempt" if created else "a fresh attempt to be created when the trainer pins it:"
    return f"resume=off: {what} {sibling} beside {attempt}, which is left as it is"


def _free_sibling(attempt: Path, stamp: str | None = None) -> Path:
    """The first ``<ts>-fresh-<stamp>[-n]`` name beside ``attempt`` that does not exist (nothing is created)."""
    stamp = stamp or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        sibling = attempt.parent / (f"{attempt.name}-fresh-{stamp}" + (f"-{n}" if n else ""))
        if not os.path.lexists(sibling):
            return sibling
    raise Refused(f"no fresh attempt name is free beside {attempt}", remedy="remove stale *-fresh-* attempts")


def pin_run_attempt(attempt_dir: Path | str, resume: str = "auto", resume_path: Path | str | None = None, *,
                    collective: bool | None = None) -> ResumeDecision:
    """``check_run_attempt``, raising ``Refused`` (the full message with its remedies) when refused; a
    fresh attempt minted beside the original (``resume="off"``) is created here, exclusively: a name
    another job took between the check and the ``mkdir`` moves on to the next free one.

    Collective when a process group of several ranks is initialised (``ranks``): rank 0 decides (and mints)
    and broadcasts the decision, so every rank resumes from the same point, or every rank raises the same
    refusal."""
    decision = Ranks.current(collective).decide(
        f"the resume guard of {attempt_dir}", lambda: _decide_and_mint(attempt_dir, resume, resume_path))
    if not decision.may_start:
        raise Refused(decision.message())
    return decision


def _decide_and_mint(attempt_dir: Path | str, resume: str, resume_path: Path | str | None) -> ResumeDecision:
    decision = check_run_attempt(attempt_dir, resume, resume_path)
    if decision.may_start and decision.attempt_dir != decision.original_attempt_dir:
        minted = Path(decision.attempt_dir)
        while True:
            try:
                minted.mkdir()
                break
            except FileExistsError:
                minted = _free_sibling(Path(decision.original_attempt_dir))
        decision.attempt_dir = str(minted)
        decision.reason = _minted_reason(minted, Path(decision.original_attempt_dir), created=True)
    return decision
