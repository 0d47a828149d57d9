"""What the ``scripts/`` shims call: one function per rule (``*_step``), the job's log and its one-line failure.

Snakemake decides what is pending (a rule's report is missing or older than its input); these
functions decide what is safe, with exactly the guarantees of the CLI verbs. A step that cannot
complete raises; the shim's ``step_job`` ends the job with its one-line error (the traceback goes to the job
log), so Snakemake marks the job failed and removes its declared output. Every step writes
a small JSON report under ``reports_dir`` as its rule output, and only that: Snakemake deletes a job's
outputs before a rerun, after a failure and on ``--delete-all-output``, so the library's own records
(manifest, receipt, merge record, staging record, teacher record) are never outputs.
A lost receipt is re-derived by publication from an archive a report or the configuration names.

A shim takes the paths of its job (artifact, reports, upload prefix) from ``workflow.triggers``, which
names them for the plan as well, and calls one function here; what planning calls lives in ``workflow.plan``
and ``workflow.config``. The batch jobs, which run the steps of many artifacts in one process, are
``workflow.batch_jobs``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..artifact import ARTIFACTS_DIR
from ..errors import CkptflowError, VerificationFailed
from ..fsutil import atomic_write_bytes
from ..jsonio import encode_json
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from ..records.step_report import write_step_report
from ..store.open import credentials_for, open_bucket_arg, store_factory
from .config import exit_with, require_base, require_bucket
from .triggers import archive_uri_of, artifact_path, prune_round_path, recorded_destinations

log = logging.getLogger(__name__)


@contextlib.contextmanager
def step_log(path: str) -> Iterator[None]:
    """Send a step's logs and stderr to its rule's log file; a step that fails writes its traceback there
    before the file is closed (so the log says why), then the error goes on to Snakemake."""
    with open(path, "w", encoding="utf-8") as log, log_to(log):
        yield


@contextlib.contextmanager
def log_to(log: Any) -> Iterator[None]:
    """``step_log`` on an open text stream: logs, stderr and a failure's traceback go there; the last line
    says how long the step took (``finished in S s``, or ``failed after S s``)."""
    started = time.perf_counter()
    saved = sys.stderr
    sys.stderr = log
    handler = logging.StreamHandler(log)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield
    except BaseException:
        traceback.print_exc(file=log)
        log.write(f"failed after {time.perf_counter() - started:.3f} s\n")
        raise
    else:
        log.write(f"finished in {time.perf_counter() - started:.3f} s\n")
    finally:
        root.removeHandler(handler)
        sys.stderr = saved


@contextlib.contextmanager
def step_job(path: str, step: str) -> Iterator[None]:
    """A rule's job: ``step_log``, and a failure ends the job with one line on stderr, the error and its
    remedy in ``--config`` terms (``workflow.config.exit_with``), which Snakemake shows above its own
    lines for the failed job; the traceback stays in the log."""
    try:
        with step_log(path):
            yield
    except Exception as exc:  # noqa: BLE001  every failure ends the job in one line; the log has the details
        exit_with(exc, step, log=path)


def write_report(path: Path | str, report: dict[str, Any]) -> None:
    """Write a step's JSON report (or a batch's outcomes) atomically, its directory made first."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, encode_json(report))


# The schema of each step whose report a batch job's outcome becomes (records.step_report).
STEP_SCHEMAS = {"publish": "report_publish", "verify": "report_verify", "prune": "report_prune_verified"}


def merge_step(artifact_dir: str, recipe: Mapping[str, Any], iteration: int, report_path: str) -> dict[str, Any]:
    """Merge one recipe into ``artifact_dir/model.pt`` (the library refuses a completed merge of another
    request unless the recipe says ``force``) and write the step report, the rule's output."""
    from ..merge import merge_experts

    result = merge_experts(recipe["mode"], list(recipe["experts"]), Path(artifact_dir) / "model.pt", base=recipe.get("base"),
                           lam=recipe.get("lam"), iteration=iteration, force=bool(recipe.get("force")),
                           progress=False)
    log.info("merge %s: %s (%s)", artifact_dir, result.status, result.reason)
    report = {
        "status": result.status, "reason": result.reason, "artifact_dir": str(result.artifact_dir),
        "iteration": result.request.iteration, "mode": result.request.mode, "lam": result.request.lam,
        "experts": [e.to_dict() for e in result.request.experts], "request_identity": result.identity,
        "replaced_identity": result.replaced_identity, "model": result.model.to_dict(),
    }
    write_report(report_path, report)
    return report


def fetch_step(artifact_uri: str, stage_root: str, credentials: str | None, report_path: str,
               receipt_dir: str | None = None) -> dict[str, Any]:
    """Fetch one archived artifact into ``stage_root/iter_N`` and write the step report, the rule's output.
    ``receipt_dir``: the pruned artifact whose receipt names the archive (``artifact_uri`` is its current
    destination); every destination that receipt lists is then tried in its order, and the report names the
    one that served (``source_uri``) and those skipped (``archive.copies.fetch_from_receipt``).

    ``.staged.json``, fetch's ownership record, is never a rule output: Snakemake would delete it before
    a rerun, and the stage would then look foreign to fetch.
    """
    from ..archive.copies import fetch_from_receipt
    from ..archive.fetch import fetch_artifact

    skipped = []
    if receipt_dir:
        result, _dest, skipped = fetch_from_receipt(receipt_dir, Path(stage_root), credentials, progress=False)
    else:
        result = fetch_artifact(artifact_uri, Path(stage_root), credentials=credentials_for(artifact_uri, credentials),
                                progress=False)
    log.info("fetch %s -> %s: %s", result.plan.source, result.path, result.status)
    report = result.to_report()
    if skipped:
        report["skipped_destinations"] = [s.to_dict() for s in skipped]
    write_report(report_path, report)
    return report


def materialize_step(base: str, out: str, ckpt_dir: str | None, artifact_uri: str | None, stage_root: str,
                     credentials: str | None, options: Mapping[str, Any], report_path: str) -> dict[str, Any]:
    """Build (or skip) the teacher ``out`` from the local artifact ``ckpt_dir``, or from the archive
    ``artifact_uri`` through the fetch rule's stage ``stage_root/iter_N`` (kept; fetch re-hashes it), so the
    teacher records the archive's identity; the library refuses a completed teacher of another identity
    unless ``options["force"]``. The skip decision comes before any download: the archive is fetched (by
    materialize, not by a fetch job before it) only when a build needs it.

    With both (a pruned artifact, ``artifact_uri`` the current destination its receipt names) the library
    resolves the artifact: its archive, from the first destination its receipt lists that serves
    (``materialize.source``); the teacher's identity does not name the destination, so a teacher built from
    one copy is skipped when another serves."""
    from ..materialize import materialize

    require_base(base)  # what the planning of materialize_teacher checks, with the same words
    kwargs = {k: options[k] for k in ("min_tensors", "expect_tensors") if options.get(k) is not None}
    if ckpt_dir:
        kwargs.update(ckpt_dir=ckpt_dir)
        if artifact_uri:  # the raw credentials value: loaded per destination, for a scheme that needs them
            kwargs.update(stage_dir=stage_root, keep_staged=True, credentials=credentials)
    else:
        kwargs.update(artifact_uri=artifact_uri, stage_dir=stage_root, keep_staged=True,
                      credentials=credentials_for(artifact_uri, credentials))
    result = materialize(base=base, out=out, verify_tensors=bool(options.get("verify", True)),
                         force=bool(options.get("force", False)), progress=False, **kwargs)
    log.info("materialize %s: %s (%s)", out, result.status, result.reason)
    report = result.to_report()
    write_report(report_path, report)
    return report


def replace_legacy_receipt_step(artifact_dir: str, upload_prefix: str, bucket: str | None, credentials: str | None,
                                report_path: str, named_by: Sequence[str] = ()) -> dict[str, Any]:
    """Publish an artifact whose ``.uploaded`` is a legacy plain-text marker, so a JSON receipt replaces it
    (publication never counts the marker as done); the report is the rule's output."""
    return publish_step(artifact_dir, upload_prefix, bucket, credentials, report_path, named_by=named_by)


def publish_step(artifact_dir: str, upload_prefix: str, bucket: str | None, credentials: str | None,
                 report_path: str | None = None, *, publication: int = 1,
                 named_by: Sequence[str] = ()) -> dict[str, Any]:
    """Publish one artifact for the workflow and write the step report (the rule's output).

    A receipt that belongs to the artifact is left as it is and no store is contacted (status
    ``recorded``: publishing elsewhere is ``ckptflow publish --add-destination``'s decision, and verify
    checks the archive). Otherwise the receipt is re-derived at the first destination the reports
    ``named_by`` name that holds this artifact's committed archive (``publish_artifact`` adopts it:
    declaration and manifest byte-identical to the local ones, every object HEAD-verified), else the
    artifact is published to the configured bucket (which adopts an identical archive as well)."""
    from ..archive.keys import object_key, run_upload_prefix
    from ..archive.publish import publish_artifact

    artifact = Path(artifact_dir)
    receipt = receipt_record.belonging_receipt(artifact)
    if receipt is not None:
        log.info("publish %s: its receipt names %s; nothing to publish", artifact_dir, archive_uri_of(receipt))
        report = {"status": "recorded", "artifact_dir": artifact_dir, "destination": receipt.destination.to_dict(),
                  "declaration_sha256": receipt.declaration_sha256, "inventory": [e.to_dict() for e in receipt.files],
                  "uploaded": [], "uploaded_bytes": 0, "removed": [], "freed_bytes": 0}
        if receipt.earlier_destinations:
            report["earlier_destinations"] = [d.to_dict() for d in receipt.earlier_destinations]
    else:
        report = None
        suffix = f"/{ARTIFACTS_DIR}/{artifact.name}"
        for dest in recorded_destinations(named_by):
            if not ("/" + dest.prefix).endswith(suffix):
                continue
            try:
                store = store_factory(credentials)(dest)
                if store.head(object_key(dest.prefix, manifest_record.FILENAME)) is None:
                    continue
                result = publish_artifact(artifact, store, run_upload_prefix(("/" + dest.prefix)[: -len(suffix)]),
                                          progress=False)
            except CkptflowError as exc:
                log.warning("publish %s: the archive a report names at %s is not adopted: %s", artifact_dir,
                            dest.to_dict(), exc)
                continue
            log.info("publish %s: receipt re-derived from the archive a report names (%s)", artifact_dir,
                     result.status)
            report = result.to_report()
            break
        if report is None:
            require_bucket(bucket)  # what planning checks when a publication is pending, in the same words
            store = open_bucket_arg(bucket, credentials)
            result = publish_artifact(artifact, store, upload_prefix, progress=False)
            log.info("publish %s: %s", artifact_dir, result.status)
            report = result.to_report()
    report["publication"] = publication
    if report_path is not None:
        report = write_step_report(report_path, report, STEP_SCHEMAS["publish"])
    return report


def verify_step(artifact_dir: str, credentials: str | None, report_path: str | None) -> dict[str, Any]:
    """Verify one published artifact and write the report (unless ``report_path`` is None: a batch records
    it); a failed verification fails the job. The outcome is recorded in ``.verified.json`` as
    ``ckptflow verify`` records it, so ``ckptflow status`` shows it without the workflow's reports."""
    from ..archive.verify import verify_artifact

    result = verify_artifact(Path(artifact_dir), store_factory(credentials), record=True)
    if not result.ok:
        raise VerificationFailed(result.failure_line())
    report = result.to_report()
    if report_path is not None:
        report = write_step_report(report_path, report, STEP_SCHEMAS["verify"])
    return report


def scrub_step(runs_root: str, credentials: str | None, slice_name: str, report_path: str) -> dict[str, Any]:
    """Scrub every published artifact under ``runs_root`` (``slice_name``: ``all`` or ``K-of-N``) and write
    the report; damage fails the job, naming the objects."""
    from ..archive.scrub import scrub_runs_root
    from ..archive.verify import Subset

    subset = None if slice_name == "all" else Subset.parse(slice_name.replace("-of-", "/"))
    result = scrub_runs_root(Path(runs_root), store_factory(credentials), subset=subset)
    if not result.ok:
        raise VerificationFailed(result.failure_line())
    report = result.to_report()
    write_report(report_path, report)
    return report


def prune_step(artifact_dir: str, credentials: str | None, report_path: str | None, *,
               round: int = 1) -> dict[str, Any]:
    """Prune one artifact if every check holds; a kept artifact is a result (in the report), not a failure.
    ``round`` is the rule's rerun trigger (``workflow.triggers.prune_round``), recorded in the report (a batch
    passes no ``report_path`` and records both)."""
    from ..archive.prune import prune_verified

    report = prune_verified([Path(artifact_dir)], store_factory(credentials)).to_report()
    if report["status"] == "failed":  # the archive no longer matches, or the local bytes are in no archive
        raise VerificationFailed(f"prune kept {artifact_dir}: {_errors(report)}",
                                 remedy="the artifact was kept; do what its reason says")
    if report_path is not None:
        report = write_round(report_path, report, round, [artifact_dir])
    return report


def restore_step(artifact_dir: str, credentials: str | None, report_path: str) -> dict[str, Any]:
    """Refill one artifact's missing payloads from the archive its receipt names and write the report, the
    rule's output (the manifest and receipt restore reads are never outputs)."""
    from ..archive.restore import restore_artifact

    report = restore_artifact(Path(artifact_dir), store_factory(credentials), progress=False).to_report()
    write_report(report_path, report)
    return report


def write_round(report_path: str, report: dict[str, Any], round: int,
                 artifact_dirs: Sequence[str | Path]) -> dict[str, Any]:
    """The prune report, with its round, then the round record beside it (``workflow.triggers.prune_round``):
    every payload file of ``artifact_dirs`` (the artifacts the job judged) absent once it finished, whatever
    freed it (this job, a killed one, ``prune-verified`` or ``publish --delete-local`` by hand), and what
    the report says it removed; a restore puts one back, and the prune is pending again."""
    from ..archive.restore import missing_payloads

    report = write_step_report(report_path, {**report, "round": round}, STEP_SCHEMAS["prune"])
    freed = {str(Path(e["path"]) / rel) for e in report["removed"] for rel in e["files"]}
    freed.update(str(Path(d) / rel) for d in artifact_dirs for rel in missing_payloads(d))
    write_report(prune_round_path(report_path), {"removed": sorted(freed), "round": round})
    return report


def _errors(report: dict[str, Any]) -> str:
    """The reasons of a prune report's kept entries that are errors, each naming its artifact and file."""
    return "; ".join(k["reason"] for k in report["kept"] if k.get("error"))


def keep_free_step(runs_root: str, keep_free: str, keep_newest: int, credentials: str | None,
                   report_path: str, *, round: int = 1) -> dict[str, Any]:
    """Free verified artifacts under ``runs_root``, oldest first, to the ``keep_free`` target; a kept artifact
    or an unmet target is a result (in the report), an inconsistent archive fails the job. ``round`` as in
    ``prune_step``."""
    from ..archive.keep_free import keep_free as free_to_target
    from ..archive.keep_free import parse_target
    from ..artifact import committed_artifacts

    report = free_to_target(Path(runs_root), parse_target(keep_free), store_factory(credentials),
                            keep_newest=int(keep_newest)).to_report()
    if report["status"] == "failed":
        raise VerificationFailed(f"prune kept artifacts under {runs_root}: {_errors(report)}",
                                 remedy="those artifacts were kept; do what each reason says")
    return write_round(report_path, report, round,
                        [artifact_path(runs_root, run, it) for run, it in committed_artifacts(runs_root)])


def status_step(runs_root: str, reports_dir: str | None, stage_dir: str | None, teachers_dir: str | None,
                out_json: str, out_txt: str) -> dict[str, Any]:
    """Write the status of every configured run: the JSON report and the rendered table (the report item)."""
    from ..status import collect_status

    def opt(value: str | None) -> Path | None:
        return Path(value) if value else None

    status = collect_status(Path(runs_root), reports_dir=opt(reports_dir), stage_dir=opt(stage_dir),
                            teachers_dir=opt(teachers_dir))
    report = status.to_report()
    write_report(out_json, report)
    Path(out_txt).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(Path(out_txt), status.render().encode("utf-8"))
    return report
