"""The batch jobs (rules publish_batch, verify_batch, prune_batch) and the per-artifact jobs that finish
their members (rules publish, verify, prune): ``batch_step``, ``finish_member``, ``member_job``.

Under Slurm a job pays for its submission, its scheduling and the start of Snakemake (twice: the batch
step and the job step) before any work; for a small artifact that is nearly all of its time. A batch job
(rule publish_batch, verify_batch, prune_batch) runs the step of many artifacts in one process, one
after another, each exactly as its own job would, and records each artifact's outcome (its report or
its one-line error, and its log) in the batch's output. The per-artifact rule (publish, verify, prune)
stays the target of its artifact: a local job that writes the report and the log from that outcome, or
fails with the artifact's own error; so one artifact's failure fails only its own target, and a rerun
retries only what has no report, afresh: the outcomes are bound to the planning that wrote the batch's
member file (``planned``), and outcomes a failed run left behind are never taken for a later run's. The
library's records (receipt, manifest) are written by the step itself as it goes: a batch killed midway
leaves each artifact published with its receipt or pending.
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import testhooks
from ..errors import CkptflowError
from ..fsutil import atomic_write_bytes
from ..records.step_report import write_step_report
from .batches import PLANNED_AT, PLANNING, batch_members_of, read_batch_plan
from .config import error_line
from .steps import (
    STEP_SCHEMAS,
    log_to,
    prune_step,
    publish_step,
    step_log,
    verify_step,
    write_report,
    write_round,
)
from .triggers import artifact_path, step_reports, upload_prefix

log = logging.getLogger(__name__)


def _batch_publish(member: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    artifact = artifact_path(config["runs_root"], member["run"], member["iteration"])
    return publish_step(artifact, upload_prefix(artifact, member["run"]), config.get("bucket"),
                        config.get("credentials"), None, publication=member["publication"],
                        named_by=step_reports(config["reports_dir"], member["run"], member["iteration"]))


def _batch_verify(member: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    return verify_step(artifact_path(config["runs_root"], member["run"], member["iteration"]),
                       config.get("credentials"), None)


def _batch_prune(member: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    return prune_step(artifact_path(config["runs_root"], member["run"], member["iteration"]),
                      config.get("credentials"), None, round=member["round"])


BATCH_STEPS = {"publish": _batch_publish, "verify": _batch_verify, "prune": _batch_prune}


def batch_step(step: str, members_path: str, config: Mapping[str, Any], out_path: str) -> dict[str, Any]:
    """Run ``step`` (publish, verify, prune) for each member of the batch file ``members_path`` (``run``,
    ``iteration`` and the rerun trigger of its own rule: ``publication`` or ``round``) in this process, one
    after another, and write the outcomes to ``out_path``, the batch rule's output: per artifact
    ``{"status": "done", "report": ...}`` or ``{"status": "failed", "error": <one line>}``, and its ``log``;
    with the planning that wrote the member file (``planned``), the only one whose jobs may use them. A
    member's failure is its outcome, not the batch's; only an interruption (a signal, a killed job) ends
    the batch, without an output."""
    run_one = BATCH_STEPS[step]
    plan = read_batch_plan(members_path)
    outcomes: dict[str, Any] = {}
    for member in plan["members"]:
        key = f"{member['run']}/{member['iteration']}"
        buffer = io.StringIO()
        try:
            with log_to(buffer):
                report = run_one(member, config)
            outcome: dict[str, Any] = {"status": "done", "report": report}
        except Exception as exc:  # noqa: BLE001  the member's failure is its own outcome, not the batch's
            outcome = {"status": "failed", "error": error_line(exc, step)}
        outcome["log"] = buffer.getvalue()
        log.info("%s %s: %s%s", step, key, outcome["status"], f": {outcome['error']}" if "error" in outcome else "")
        outcomes[key] = outcome
        testhooks.reached("batch:after-member", key)
    result = {"step": step, "planned": plan["planned"], "outcomes": outcomes}
    write_report(out_path, result)
    return result


class BatchMemberFailed(CkptflowError):
    """One artifact's step failed (in its batch job, or in its own job): its own target fails with the
    step's one line, which names the artifact's log."""


def member_job(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a per-artifact rule's body in Snakemake's own process: a failure fails the job with its one line,
    the line a script job's ``step_job`` prints, which Snakemake shows above its error block."""
    try:
        return fn(*args, **kwargs)
    except BatchMemberFailed as exc:
        raise StepFailed(f"ckptflow: {exc.message}") from None


class StepFailed(Exception):
    """A per-artifact job failed: the message is its one line."""


_direct = threading.Lock()


def _outcome_of(batch_path: str | None, run: str, iteration: str) -> dict[str, Any] | None:
    """The artifact's outcome in the batch output ``batch_path`` when this run's batch job wrote it: its
    ``planned`` is the one of the batch's member file, and that file was written by this process's
    planning (``workflow.batches.PLANNING``) or the output is newer than this process's start (Snakemake ran
    the batch again from an earlier planning's file: ``-R``, a changed input). An output an earlier run left
    (a temp() file whose consumer failed stays) judged what was there then, and is never used: None, and
    the member's job runs its step itself."""
    if batch_path is None:
        return None
    try:
        planned = read_batch_plan(batch_members_of(batch_path))["planned"]
    except CkptflowError:
        planned = None
    batch = json.loads(Path(batch_path).read_bytes())
    this_run = planned == PLANNING or os.stat(batch_path).st_mtime >= PLANNED_AT
    if planned is None or batch.get("planned") != planned or not this_run:
        log.warning("%s is the outcome of an earlier run: %s/%s runs its step itself", batch_path, run, iteration)
        return None
    return batch["outcomes"][f"{run}/{iteration}"]


def finish_member(step: str, run: str, iteration: str, batch_path: str | None, config: Mapping[str, Any],
                  report_path: str, log_path: str, *, publication: int = 1, round: int = 1) -> dict[str, Any]:
    """The per-artifact rule's job (publish, verify, prune): take its artifact's outcome from its batch's
    output and write the report and the log it recorded, or fail with the artifact's own error. Without a
    batch (a rerun that Snakemake decides on after planning: a lost receipt, a restored payload, a changed
    input), or with a batch output this planning did not produce, it runs the step itself, as its batch
    would have, one such job at a time in this process."""
    outcome = _outcome_of(batch_path, run, iteration)
    if outcome is None:
        member = {"run": run, "iteration": iteration, "publication": publication, "round": round}
        with _direct:
            try:
                with step_log(log_path):
                    report = BATCH_STEPS[step](member, config)
            except Exception as exc:
                raise BatchMemberFailed(f"{error_line(exc, step)} (details: {log_path})") from exc
    else:
        atomic_write_bytes(Path(log_path), outcome["log"].encode("utf-8"))
        if outcome["status"] != "done":
            raise BatchMemberFailed(f"{outcome['error']} (details: {log_path})")
        report = outcome["report"]
        report["batch"] = Path(batch_path).name.removesuffix(".json")
        if step == "publish":
            report["publication"] = publication  # this job's trigger, whatever the batch recorded
    if step == "prune":
        return write_round(report_path, report, round, [artifact_path(config["runs_root"], run, iteration)])
    return write_step_report(report_path, report, STEP_SCHEMAS[step])


def member_rule(step: str, wildcards: Any, input: Any, output: Any, log: Any, config: Mapping[str, Any],
                **triggers: int) -> dict[str, Any]:
    """The ``run:`` body of a per-artifact rule (publish, verify, prune): ``finish_member`` on its batch's
    outcomes when it takes one (``input.batch``), as a ``member_job``."""
    batch = list(input.batch) if hasattr(input, "batch") else []
    return member_job(finish_member, step, wildcards.run, wildcards.iteration, batch[0] if batch else None, config,
                      output.report, log[0], **triggers)
