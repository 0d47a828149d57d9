"""The resume guard: no cold restart over a committed artifact.

``pin_run_attempt(attempt_dir, resume, resume_path)`` decides, before a training job writes anything,
whether it may start in the attempt directory ``<run>/<ts>`` and from where:

- ``resume="auto"`` resumes from the newest resumable candidate: a full checkpoint under ``checkpoints/``
  (an ``iter_N`` directory holding ``trainer.pt``) or an artifact committed with the full component plan
  (model, optim, trainer). It never resumes from a model-only (partial) artifact;
- when the attempt holds committed ``checkpoint_artifacts/iter_*`` (manifest present), a step-0 restart is
  refused, and so is a candidate behind the newest committed artifact: resuming it would replay up to
  that artifact and collide with it one save later (under Slurm requeue, in a loop);
- an explicit ``resume_path`` is placed by the ``iter_N`` segment of its path, else by its validated trainer
  state (``optimizer_step``/``iter`` in ``trainer.pt``, or at the top level of a single-file checkpoint,
  loaded with ``weights_only=True``); one whose iteration cannot be established is refused;
- a fresh attempt, and an interrupted artifact directory without its manifest, are unaffected;
- ``resume="off"`` starts in the attempt directory when it holds nothing, else mints a fresh attempt beside it.

A refusal names the attempt directory and three remedies, each an operator decision (``REMEDIES``).
"""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..artifact import ARTIFACTS_DIR, ITER_DIR_RE
from ..errors import InvalidRecord, Refused, UsageError
from ..records import manifest as manifest_record
from .write import TRAINER_FILE

CHECKPOINTS_DIR = "checkpoints"
FULL_PLAN = frozenset({"model", "optim", "trainer"})
_ITER_SEGMENT = re.compile(r"^iter_(\d+)$")


def remedies(attempt_dir: Path, newest: Path | None) -> list[str]:
    model = f"{newest}/model.pt" if newest is not None else "the committed model artifact (checkpoint_artifacts/iter_N/model.pt)"
    return [
        f"continue from the artifact as a NEW run: a new job name, init from {model}, advance the data cursor by "
        "the exact number of consumed examples, fresh optimizer state",
        f"set resume=off (ckptflow resume-check --resume off) to mint a fresh attempt beside {attempt_dir}",
        "save the full component plan [model, optimizer, trainer_state] when exact resume across requeues is required",
    ]


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


def committed_artifacts(attempt_dir: Path) -> dict[int, Path]:
    """Every ``checkpoint_artifacts/iter_N`` holding its manifest (interrupted saves are ignored)."""
    root = attempt_dir / ARTIFACTS_DIR
    found: dict[int, Path] = {}
    if root.is_dir():
        for d in root.iterdir():
            m = ITER_DIR_RE.match(d.name)
            if m and d.is_dir() and manifest_record.path_in(d).is_file():
                found[int(m.group(1))] = d
    return dict(sorted(found.items()))


def resumable_checkpoints(attempt_dir: Path) -> dict[int, Path]:
    """Full checkpoints under ``checkpoints/``: ``iter_N`` directories holding ``trainer.pt``."""
    root = attempt_dir / CHECKPOINTS_DIR
    found: dict[int, Path] = {}
    if root.is_dir():
        for d in root.iterdir():
            m = ITER_DIR_RE.match(d.name)
            if m and d.is_dir() and not d.is_symlink() and (d / TRAINER_FILE).is_file():
                found[int(m.group(1))] = d
    return dict(sorted(found.items()))


def is_full_plan_artifact(artifact_dir: Path) -> bool:
    try:
        return FULL_PLAN <= set(manifest_record.read_manifest(artifact_dir).components)
    except (InvalidRecord, OSError):
        return False


def iteration_of_resume_path(path: Path) -> tuple[int | None, str]:
    """The iteration an explicit resume path stands for, and how it was established (or why not)."""
    for part in reversed(path.parts):
        m = _ITER_SEGMENT.match(part)
        if m:
            return int(m.group(1)), f"the iter_* segment {part!r} of its path"
    if path.is_dir():
        source = path / TRAINER_FILE
        if not source.is_file():
            return None, f"it has no iter_* segment and no {TRAINER_FILE}"
    elif path.is_file():
        source = path
    else:
        return None, "it does not exist"
    return _iteration_from_trainer_state(source)


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


def check_run_attempt(attempt_dir: Path | str, resume: str = "auto", resume_path: Path | str | None = None) -> ResumeDecision:
    """The decision, without raising on a refusal (``pin_run_attempt`` raises)."""
    if resume not in ("auto", "off"):
        raise UsageError(f"resume={resume!r} is not auto or off")
    attempt = Path(attempt_dir).absolute()
    artifacts = committed_artifacts(attempt)
    newest_it, newest = (next(reversed(artifacts.items())) if artifacts else (None, None))
    base = {"attempt_dir": str(attempt), "original_attempt_dir": str(attempt), "resume": resume,
            "newest_artifact": str(newest) if newest else None, "newest_artifact_iteration": newest_it}

    def refuse(reason: str) -> ResumeDecision:
        return ResumeDecision("refused", reason, remedies=remedies(attempt, newest), **base)

    if resume == "off":
        return _mint_fresh(attempt, base)
    if resume_path is not None:
        cand = Path(resume_path).absolute()
        if manifest_record.path_in(cand).is_file() and not is_full_plan_artifact(cand):
            return refuse(f"resume=auto never resumes from a model-only artifact ({cand})")
        it, how = iteration_of_resume_path(cand)
        if it is None:
            return refuse(f"the iteration of resume path {cand} cannot be established: {how}; nothing proves it is "
                          "at or beyond the newest committed artifact")
    else:
        cands = {**resumable_checkpoints(attempt), **{i: d for i, d in artifacts.items() if is_full_plan_artifact(d)}}
        if not cands:
            if newest is None:
                return ResumeDecision("fresh", "a fresh attempt: no committed artifact, no resumable checkpoint", **base)
            return refuse(f"it holds committed artifact {newest} and nothing resumable: a step-0 restart would "
                          f"collide with iteration {newest_it} at its first save")
        it = max(cands)
        cand, how = cands[it], f"the newest resumable checkpoint {cands[it]}"
    if newest_it is not None and it < newest_it:
        return refuse(f"the resume point {cand} (iteration {it}, from {how}) is behind the committed artifact "
                      f"{newest} (iteration {newest_it}): resuming would replay up to it and collide one save later")
    return ResumeDecision("resume", f"resume from iteration {it} ({how})", resume_from=str(cand),
                          resume_iteration=it, **base)


def _mint_fresh(attempt: Path, base: dict[str, Any]) -> ResumeDecision:
    if not attempt.exists() or not any(attempt.iterdir()):
        return ResumeDecision("fresh", "resume=off in an empty attempt directory", **base)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for n in range(1000):
        sibling = attempt.parent / (f"{attempt.name}-fresh-{stamp}" + (f"-{n}" if n else ""))
        try:
            sibling.mkdir()
        except FileExistsError:
            continue
        return ResumeDecision("fresh", f"resume=off: a fresh attempt {sibling} beside {attempt}, which is left as it is",
                              **{**base, "attempt_dir": str(sibling)})
    raise Refused(f"no fresh attempt name is free beside {attempt}", remedy="remove stale *-fresh-* attempts")


def pin_run_attempt(attempt_dir: Path | str, resume: str = "auto", resume_path: Path | str | None = None) -> ResumeDecision:
    """``check_run_attempt``, raising ``Refused`` (the full message with its remedies) when refused."""
    decision = check_run_attempt(attempt_dir, resume, resume_path)
    if not decision.may_start:
        raise Refused(decision.message())
    return decision
