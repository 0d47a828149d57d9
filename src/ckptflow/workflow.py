"""The library side of the Snakemake steps: one function per rule, called by the ``scripts/`` shims.

Snakemake decides what is pending (a rule's report is missing or older than its input); these
functions decide what is safe, with exactly the guarantees of the CLI verbs. A step that cannot
complete raises; the shim's ``step_job`` ends the job with its one-line error (the traceback goes to the job
log), so Snakemake marks the job failed and removes its declared output. Every step writes
a small JSON report under ``reports_dir`` as its rule output, and only that: Snakemake deletes a job's
outputs before a rerun, after a failure and on ``--delete-all-output``, so the library's own records
(manifest, receipt, ``.merge-complete.json``, ``.staged.json``, ``.materialized``) are never outputs.
A lost receipt is re-derived by publication from an archive a report or the configuration names.

The planning helpers (``teacher_source``, ``records_fingerprint``, ``show_status``; the configuration and
its checks live in ``workflow_config``, re-exported here) are what the named input functions of
``rules/common.smk`` call: they read records (and stat the files records name) only and never contact a
store; ``show_status`` writes the status table only when Snakemake plans without executing (``--report``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .artifact import ARTIFACTS_DIR, committed_artifacts  # rules/common.smk lists artifacts through it too
from .errors import CkptflowError, NotFound, Refused, VerificationFailed
from .fsutil import atomic_write_bytes
from .jsonio import encode_json
from .records import manifest as manifest_record
from .records import receipt as receipt_record
from .store.open import credentials_for, open_bucket_arg, store_factory
from .workflow_config import (  # noqa: F401  (the planning names rules/common.smk and the shims use)
    exit_with,
    iteration_name,
    merge_recipe,
    normalise_config,
    parse_iteration,
    require_base,
    require_bucket,
    resolve_run,
    runs_holding,
)

log = logging.getLogger(__name__)


@contextlib.contextmanager
def step_log(path: str) -> Iterator[None]:
    """Send a step's logs and stderr to its rule's log file; a step that fails writes its traceback there
    before the file is closed (so the log says why), then the error goes on to Snakemake."""
    with open(path, "w", encoding="utf-8") as log:
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
            raise
        finally:
            root.removeHandler(handler)
            sys.stderr = saved


@contextlib.contextmanager
def step_job(path: str, step: str) -> Iterator[None]:
    """A rule's job: ``step_log``, and a failure ends the job with one line on stderr, the error and its
    remedy in ``--config`` terms (``workflow_config.exit_with``), which Snakemake shows above its own
    lines for the failed job; the traceback stays in the log."""
    try:
        with step_log(path):
            yield
    except Exception as exc:  # noqa: BLE001  every failure ends the job in one line; the log has the details
        exit_with(exc, step, log=path)


def _write_report(path: Path | str, report: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, encode_json(report))


# --------------------------------------------------------------------------------------------- planning

# Report subdirectories whose files are records of finished jobs (rerun triggers of the status rule).
REPORT_KINDS = ("merge", "legacy-receipt", "verify", "prune", "fetch", "materialize")


def artifact_of(record: str) -> str:
    """The artifact directory a rule's input names: the directory holding its manifest or receipt."""
    return os.path.dirname(record)


def artifact_path(runs_root: str, run: str, iteration: str) -> str:
    """The artifact directory of a job's ``run`` and ``iteration`` wildcards."""
    return f"{runs_root.rstrip('/')}/{run}/{ARTIFACTS_DIR}/{iteration}"


def step_reports(reports_dir: str, run: str, iteration: str) -> list[str]:
    """The reports of one artifact that name its archive's destination: publish, verify, legacy-receipt."""
    return [f"{reports_dir.rstrip('/')}/{kind}/{run}/{iteration}.json" for kind in ("publish", "verify", "legacy-receipt")]


def upload_prefix(run: str) -> str:
    """Where a run's artifacts are published under the bucket: ``<run>/checkpoints`` (``keys.run_upload_prefix``;
    ``publish_artifact`` checks it against the artifact's path like any explicit prefix)."""
    from .archive.keys import run_upload_prefix

    return run_upload_prefix(run)


@dataclass(frozen=True)
class TeacherSource:
    """Where the teacher of one artifact is built from: ``local`` (the artifact itself), ``merge`` (the
    artifact the merge rule writes), or ``archive`` (``uri``, fetched into the stage only for a build)."""

    kind: str
    artifact_dir: Path
    uri: str | None = None
    why: str = ""


def _model_present(artifact_dir: Path) -> tuple[bool, str]:
    manifest = manifest_record.read_manifest(artifact_dir)
    model = manifest.components.get("model")
    if model is None or not hasattr(model, "size"):
        raise Refused(f"the manifest of {artifact_dir} has no 'model' file component",
                      path=str(manifest_record.path_in(artifact_dir)), remedy="materialize an artifact that holds a model.pt")
    path = artifact_dir / model.path
    try:
        size = path.stat().st_size if path.is_file() else None
    except OSError:
        size = None
    if size == model.size:
        return True, f"{path} is present with its recorded size"
    return False, f"{path} is {'missing' if size is None else f'{size} bytes, not {model.size}'}"


def archive_uri_of(receipt: receipt_record.Receipt) -> str:
    """The archived artifact's URI a JSON receipt names (``archive.keys.receipt_archive_uri``)."""
    from .archive.keys import receipt_archive_uri

    return str(receipt_archive_uri(receipt))


def teacher_source(artifact_dir: str | Path, run: str, *, bucket: str | None, has_recipe: bool) -> TeacherSource:
    """Choose the source of ``materialize_teacher`` from local records (sizes only; the library verifies)."""
    artifact_dir = Path(artifact_dir)
    if not manifest_record.path_in(artifact_dir).is_file():
        if has_recipe:
            return TeacherSource("merge", artifact_dir, why="the merge recipe of this iteration writes it")
        if artifact_dir.exists():
            raise NotFound(f"{artifact_dir} has no {manifest_record.FILENAME}: it is not a committed artifact",
                           path=str(artifact_dir), remedy="wait for the save to finish, or seal the artifact")
        uri = require_bucket(bucket).child(f"{run}/{ARTIFACTS_DIR}/{artifact_dir.name}")
        return TeacherSource("archive", artifact_dir, str(uri), why=f"no local {artifact_dir}")
    present, why = _model_present(artifact_dir)
    if present:
        return TeacherSource("merge" if has_recipe else "local", artifact_dir, why=why)
    if receipt_record.is_legacy_receipt(artifact_dir):
        raise Refused(f"{why}, and {receipt_record.path_in(artifact_dir)} is a legacy plain-text marker that names "
                      "no archive", path=str(artifact_dir), remedy="run `snakemake publish_all` to replace it, or "
                      "restore the payload")
    try:
        receipt = receipt_record.read_receipt(artifact_dir)
    except CkptflowError as exc:
        raise NotFound(f"{why}, and no receipt names its archive: {exc}", path=str(artifact_dir),
                       remedy="restore the payload, or publish the artifact before pruning it") from None
    # Only a receipt of this very artifact names its archive: a copied one would build another teacher.
    receipt_record.check_belongs(receipt, artifact_dir, expected_prefix=f"{run}/{ARTIFACTS_DIR}/{artifact_dir.name}")
    return TeacherSource("archive", artifact_dir, archive_uri_of(receipt), why=f"{why}; its receipt names the archive")


def records_fingerprint(runs_root: str | Path, reports_dir: str | Path, stage_dir: str | Path,
                        teachers_dir: str | Path, status: Any = None) -> str:
    """The status rule's rerun trigger: a digest of what the status table would say now (the report of
    ``collect_status``, which stats every file a record names) and of the path, size and mtime of every
    record it reads (the artifacts', stages' and teachers' records and the step reports, not the table
    itself). A payload lost or pruned behind the workflow's back changes the first even when no record
    changed. ``status``: that report's ``collect_status`` result when the caller has it already."""
    from .status import collect_status

    names = {manifest_record.FILENAME, receipt_record.FILENAME, ".merge-complete.json", ".staged.json",
             ".materialized"}
    roots = [(Path(runs_root), names), (Path(stage_dir), names), (Path(teachers_dir), names),
             *((Path(reports_dir) / kind, None) for kind in REPORT_KINDS)]
    h = hashlib.sha256()
    for root, wanted in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                if not (name.endswith(".json") if wanted is None else name in wanted):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except OSError:  # removed while walking: not a record any more
                    continue
                h.update(f"{dirpath}/{name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    if Path(runs_root).is_dir():
        if status is None:
            status = collect_status(Path(runs_root), reports_dir=Path(reports_dir), stage_dir=Path(stage_dir),
                                    teachers_dir=Path(teachers_dir))
        h.update(encode_json(status.to_report()))
    return h.hexdigest()

# --------------------------------------------------------------------------------------------- steps


def merge_step(artifact_dir: str, recipe: Mapping[str, Any], iteration: int, report_path: str) -> dict[str, Any]:
    """Merge one recipe into ``artifact_dir/model.pt`` (the library refuses a completed merge of another
    request unless the recipe says ``force``) and write the step report, the rule's output."""
    from .merge import merge_experts

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
    _write_report(report_path, report)
    return report


def fetch_step(artifact_uri: str, stage_root: str, credentials: str | None, report_path: str) -> dict[str, Any]:
    """Fetch one archived artifact into ``stage_root/iter_N`` and write the step report, the rule's output.

    ``.staged.json``, fetch's ownership record, is never a rule output: Snakemake would delete it before
    a rerun, and the stage would then look foreign to fetch.
    """
    from .archive.fetch import fetch_artifact

    result = fetch_artifact(artifact_uri, Path(stage_root), credentials=credentials_for(artifact_uri, credentials),
                            progress=False)
    log.info("fetch %s -> %s: %s", artifact_uri, result.path, result.status)
    report = result.to_report()
    _write_report(report_path, report)
    return report


def materialize_step(base: str, out: str, ckpt_dir: str | None, artifact_uri: str | None, stage_root: str,
                     credentials: str | None, options: Mapping[str, Any], report_path: str) -> dict[str, Any]:
    """Build (or skip) the teacher ``out`` from the local artifact ``ckpt_dir`` used in place, or from
    ``artifact_uri`` through the fetch rule's stage ``stage_root/iter_N`` (kept; fetch re-hashes it), so
    the teacher records the archive's identity; the library refuses a completed teacher of another
    identity unless ``options["force"]``. The skip decision comes before any download: the archive is
    fetched (by materialize, not by a fetch job before it) only when a build needs it."""
    from .materialize import materialize

    require_base(base)  # what the planning of materialize_teacher checks, with the same words
    kwargs = {k: options[k] for k in ("min_tensors", "expect_tensors") if options.get(k) is not None}
    if artifact_uri:
        kwargs.update(artifact_uri=artifact_uri, stage_dir=stage_root, keep_staged=True,
                      credentials=credentials_for(artifact_uri, credentials))
    else:
        kwargs.update(ckpt_dir=ckpt_dir)
    result = materialize(base=base, out=out, verify_tensors=bool(options.get("verify", True)),
                         force=bool(options.get("force", False)), progress=False, **kwargs)
    log.info("materialize %s: %s (%s)", out, result.status, result.reason)
    report = result.to_report()
    _write_report(report_path, report)
    return report


def replace_legacy_receipt_step(artifact_dir: str, upload_prefix: str, bucket: str | None, credentials: str | None,
                                report_path: str, named_by: Sequence[str] = ()) -> dict[str, Any]:
    """Publish an artifact whose ``.uploaded`` is a legacy plain-text marker, so a JSON receipt replaces it
    (publication never counts the marker as done); the report is the rule's output."""
    return publish_step(artifact_dir, upload_prefix, bucket, credentials, report_path, named_by=named_by)


def publication_number(artifact_dir: str | Path, report_path: str | Path) -> int:
    """The publish job's rerun trigger: the publication number its report records (1 without one), plus
    one while the artifact has no receipt that belongs to it. It equals the number the last job was given
    (and wrote) until the receipt is lost again, so a lost receipt reruns the job however recent its report."""
    try:
        number = int(json.loads(Path(report_path).read_bytes()).get("publication", 1))
    except (OSError, ValueError, AttributeError, TypeError):
        return 1
    return number if receipt_record.belonging_receipt(artifact_dir) is not None else number + 1


def recorded_destinations(report_paths: Sequence[str | Path]) -> list[receipt_record.ReceiptDestination]:
    """The destinations the given step reports (publish, verify, legacy-receipt) name, in order, once each;
    a missing or unreadable report names none."""
    found: list[receipt_record.ReceiptDestination] = []
    for path in report_paths:
        try:
            report = json.loads(Path(path).read_bytes())
            dests = [report["destination"], *report.get("earlier_destinations", ())]
            parsed = [receipt_record.ReceiptDestination(d["scheme"], d["endpoint"], d["bucket"], d["prefix"])
                      for d in dests]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        found += [d for d in parsed if d not in found]
    return found


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
    from .archive.keys import object_key, run_upload_prefix
    from .archive.publish import publish_artifact

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
        _write_report(report_path, report)
    return report


def verify_step(artifact_dir: str, credentials: str | None, report_path: str) -> dict[str, Any]:
    """Verify one published artifact and write the report; a failed verification fails the job."""
    from .archive.verify import verify_artifact

    result = verify_artifact(Path(artifact_dir), store_factory(credentials))
    if not result.ok:
        raise VerificationFailed(result.failure_line())
    report = result.to_report()
    _write_report(report_path, report)
    return report


def scrub_slice_name(subset: str | None) -> str:
    """The scrub report's name for config ``scrub_subset``: ``all``, or ``K-of-N`` for ``K/N`` (checked)."""
    from .archive.verify import Subset

    if subset is None:
        return "all"
    parsed = Subset.parse(str(subset))
    return f"{parsed.k}-of-{parsed.n}"


def scrub_step(runs_root: str, credentials: str | None, slice_name: str, report_path: str) -> dict[str, Any]:
    """Scrub every published artifact under ``runs_root`` (``slice_name``: ``all`` or ``K-of-N``) and write
    the report; damage fails the job, naming the objects."""
    from .archive.scrub import scrub_runs_root
    from .archive.verify import Subset

    subset = None if slice_name == "all" else Subset.parse(slice_name.replace("-of-", "/"))
    result = scrub_runs_root(Path(runs_root), store_factory(credentials), subset=subset)
    if not result.ok:
        raise VerificationFailed(result.failure_line())
    report = result.to_report()
    _write_report(report_path, report)
    return report


def prune_step(artifact_dir: str, credentials: str | None, report_path: str) -> dict[str, Any]:
    """Prune one artifact if every check holds; a kept artifact is a result (in the report), not a failure."""
    from .archive.prune import prune_verified

    report = prune_verified([Path(artifact_dir)], store_factory(credentials)).to_report()
    if report["status"] == "failed":
        raise VerificationFailed(f"inconsistent remote objects for {artifact_dir}: {report['kept']}",
                                 remedy="the artifact was kept; inspect the archive")
    _write_report(report_path, report)
    return report


def restore_scope(runs_root: str | Path, run: str | None) -> list[tuple[str, str, bool]]:
    """``(run, iter_N, pruned)`` of every committed artifact of ``run`` (None: of every run); ``pruned``: it
    has a receipt and lacks a payload file, so ``restore_all`` refills it. Stats only; restore re-judges."""
    from .archive.restore import missing_payloads

    wanted = run.strip("/") if run else None
    return [(r, name, bool(missing_payloads(Path(artifact_path(str(runs_root), r, name)))))
            for r, name in committed_artifacts(runs_root) if wanted in (None, r)]


def restore_inputs(artifact_dir: str) -> list[str]:
    """The restore job's inputs: the artifact directory and each existing directory that lacks one of its
    payload files. Removing a file changes its directory's mtime, so a restore report older than that
    reruns; a fully pruned artifact has only its top directory, before and after, so the set is stable."""
    from .archive.restore import missing_payloads

    dirs = {os.path.dirname(f"{artifact_dir}/{rel}") for rel in missing_payloads(Path(artifact_dir))}
    return [artifact_dir, *sorted(d for d in dirs - {artifact_dir} if os.path.isdir(d))]


def restore_step(artifact_dir: str, credentials: str | None, report_path: str) -> dict[str, Any]:
    """Refill one artifact's missing payloads from the archive its receipt names and write the report, the
    rule's output (the manifest and receipt restore reads are never outputs)."""
    from .archive.restore import restore_artifact

    report = restore_artifact(Path(artifact_dir), store_factory(credentials), progress=False).to_report()
    _write_report(report_path, report)
    return report


def keep_free_target(config: Mapping[str, Any]) -> Any:
    """``prune: {keep_free}`` of a normalised configuration, parsed (``archive.keep_free.parse_target``; a wrong
    spelling is a usage error at planning), or None: ``prune_all`` then prunes every verified artifact."""
    from .archive.keep_free import parse_target

    value = (config.get("prune") or {}).get("keep_free")
    return None if value is None else parse_target(value)


def keep_free_step(runs_root: str, keep_free: str, keep_newest: int, credentials: str | None,
                   report_path: str) -> dict[str, Any]:
    """Free verified artifacts under ``runs_root``, oldest first, to the ``keep_free`` target; a kept artifact
    or an unmet target is a result (in the report), an inconsistent archive fails the job."""
    from .archive.keep_free import keep_free as free_to_target
    from .archive.keep_free import parse_target

    report = free_to_target(Path(runs_root), parse_target(keep_free), store_factory(credentials),
                            keep_newest=int(keep_newest)).to_report()
    if report["status"] == "failed":
        raise VerificationFailed(f"inconsistent remote objects under {runs_root}: "
                                 f"{[k for k in report['kept'] if k.get('error')]}",
                                 remedy="those artifacts were kept; inspect their archives")
    _write_report(report_path, report)
    return report


def status_step(runs_root: str, reports_dir: str | None, stage_dir: str | None, teachers_dir: str | None,
                out_json: str, out_txt: str) -> dict[str, Any]:
    """Write the status of every configured run: the JSON report and the rendered table (the report item)."""
    from .status import collect_status

    def opt(value: str | None) -> Path | None:
        return Path(value) if value else None

    status = collect_status(Path(runs_root), reports_dir=opt(reports_dir), stage_dir=opt(stage_dir),
                            teachers_dir=opt(teachers_dir))
    report = status.to_report()
    _write_report(out_json, report)
    Path(out_txt).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(Path(out_txt), status.render().encode("utf-8"))
    return report


_shown: set[str] = set()  # tables already printed by this Snakemake process (planning may ask twice)


def show_status(runs_root: str, reports_dir: str, stage_dir: str, teachers_dir: str, out_json: str, out_txt: str,
                *, executing: bool) -> Any:
    """The status table while Snakemake plans the status job (see rules/common.smk): when Snakemake will
    execute (a run or a dry-run), the current table on stdout, once per process, whether or not the job
    runs; when it plans without executing (``--report``, ``--summary``, ``--dag``), the table files
    rewritten if they differ from the current table, so what those read is current. Returns the status
    (``records_fingerprint`` digests it)."""
    from .status import collect_status

    status = collect_status(Path(runs_root), reports_dir=Path(reports_dir), stage_dir=Path(stage_dir),
                            teachers_dir=Path(teachers_dir))
    text = status.render()
    if executing:
        if out_txt not in _shown:
            _shown.add(out_txt)
            sys.stdout.write(text)
            sys.stdout.flush()
        return status
    report = encode_json(status.to_report())
    for path, data in ((Path(out_json), report), (Path(out_txt), text.encode("utf-8"))):
        try:
            same = path.read_bytes() == data
        except OSError:
            same = False
        if not same:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, data)
    return status

