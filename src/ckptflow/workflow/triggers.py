"""What the workflow's plan reads from records: the paths a job is named by, its rerun triggers and where
the teacher comes from.

``workflow.plan`` (the logic of the Snakefile's input functions) calls these, and the ``scripts/`` shims take
their paths from here (the configuration and its checks live in ``workflow.config``; the batch jobs' plans
in ``workflow.batches``; the jobs in ``workflow.steps`` and ``workflow.batch_jobs``):

- paths: ``artifact_path`` (the artifact of a job's ``run`` and ``iteration``), ``artifact_of``,
  ``step_reports``, ``upload_prefix`` (``archive.keys``' derivation); the archive's URI of a receipt,
  ``archive_uri_of``;
- rerun triggers: ``publication_number``, ``prune_round``, ``recorded_destinations``, ``restore_inputs``,
  ``records_fingerprint``; the scopes of ``restore_all`` and ``scrub``, ``keep_free_target``; what a step
  report records (``report_batch``, ``report_round``);
- ``teacher_source``: where ``materialize_teacher`` builds from;
- ``show_status``: the status table while the status job is planned.

They read records (and stat the files records name) only and never contact a store; ``show_status``
writes the status table only when Snakemake plans without executing (``--report``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifact import ARTIFACTS_DIR, committed_artifacts
from ..errors import CkptflowError, NotFound, Refused
from ..fsutil import atomic_write_bytes
from ..jsonio import encode_json
from ..records import manifest as manifest_record
from ..records import materialized as materialized_record
from ..records import merge_record
from ..records import receipt as receipt_record
from ..records import staging as staging_record
from .config import require_bucket

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


def upload_prefix(artifact_dir: str | Path, run: str) -> str:
    """Where the artifact of a job's ``run`` is published under the bucket: ``<project>/<group>/<run>/<ts>/
    checkpoints`` derived from its path as the CLI and the trainer derive it, whatever the depth of runs_root
    (``keys.run_tree_upload_prefix``; ``<run>/checkpoints`` outside the runs layout)."""
    from ..archive.keys import run_tree_upload_prefix

    return run_tree_upload_prefix(artifact_dir, run)


@dataclass(frozen=True)
class TeacherSource:
    """Where the teacher of one artifact is built from: ``local`` (the artifact itself), ``merge`` (the
    artifact the merge rule writes), or ``archive`` (``uri``, fetched into the stage only for a build).
    ``receipt``: the archive is the one the pruned artifact's receipt names (``uri`` its current destination;
    the steps try every destination it lists, ``archive.copies``)."""

    kind: str
    artifact_dir: Path
    uri: str | None = None
    why: str = ""
    receipt: bool = False
    schemes: tuple[str, ...] = ()  # the schemes of every destination the receipt lists


def _model_present(artifact_dir: Path) -> tuple[bool, str]:
    manifest = manifest_record.read_manifest(artifact_dir)
    model = manifest.components.get("model")
    if model is None:  # a Hugging Face Trainer artifact: the files a teacher reads (or its refusal by name)
        from ..materialize.hf_source import trainer_files_present

        return trainer_files_present(artifact_dir, manifest)
    if not hasattr(model, "size"):
        raise Refused(f"the manifest of {artifact_dir} has no 'model' file component: it is a DCP directory",
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
    from ..archive.keys import receipt_archive_uri

    return str(receipt_archive_uri(receipt))


def teacher_source(artifact_dir: str | Path, run: str, *, bucket: str | None, has_recipe: bool) -> TeacherSource:
    """Choose the source of ``materialize_teacher`` from local records (sizes only; the library verifies). The
    archive is expected under the artifact's derived prefix (``keys.run_tree_artifact_prefix``), where every
    front end publishes it."""
    from ..archive.keys import run_tree_artifact_prefix

    artifact_dir = Path(artifact_dir)
    if not manifest_record.path_in(artifact_dir).is_file():
        if has_recipe:
            return TeacherSource("merge", artifact_dir, why="the merge recipe of this iteration writes it")
        if artifact_dir.exists():
            raise NotFound(f"{artifact_dir} has no {manifest_record.FILENAME}: it is not a committed artifact",
                           path=str(artifact_dir), remedy="wait for the save to finish, or seal the artifact")
        uri = require_bucket(bucket).child(run_tree_artifact_prefix(artifact_dir, run))
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
    receipt_record.check_belongs(receipt, artifact_dir, expected_prefix=run_tree_artifact_prefix(artifact_dir, run))
    return TeacherSource("archive", artifact_dir, archive_uri_of(receipt), why=f"{why}; its receipt names the archive",
                         receipt=True, schemes=tuple(d.scheme for d in receipt.destinations))


def records_fingerprint(runs_root: str | Path, reports_dir: str | Path, stage_dir: str | Path,
                        teachers_dir: str | Path, status: Any = None) -> str:
    """The status rule's rerun trigger: a digest of what the status table would say now (the report of
    ``collect_status``, which stats every file a record names) and of the path, size and mtime of every
    record it reads (the artifacts', stages' and teachers' records and the step reports, not the table
    itself). A payload lost or pruned behind the workflow's back changes the first even when no record
    changed. ``status``: that report's ``collect_status`` result when the caller has it already."""
    from ..status import collect_status

    names = {manifest_record.FILENAME, receipt_record.FILENAME, merge_record.FILENAME, staging_record.FILENAME,
             materialized_record.FILENAME}
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

def publication_number(artifact_dir: str | Path, report_path: str | Path) -> int:
    """The publish job's rerun trigger: the publication number its report records (1 without one), plus
    one while the artifact has no receipt that belongs to it. It equals the number the last job was given
    (and wrote) until the receipt is lost again, so a lost receipt reruns the job however recent its report."""
    try:
        number = int(json.loads(Path(report_path).read_bytes()).get("publication", 1))
    except (OSError, ValueError, AttributeError, TypeError):
        return 1
    return number if receipt_record.belonging_receipt(artifact_dir) is not None else number + 1


def prune_round_path(report_path: str | Path) -> Path:
    """Where a prune job records its round beside its report (``<report>.round.json``): not an output, so
    Snakemake, which deletes a job's outputs before running it, never deletes it."""
    path = Path(report_path)
    return path.with_name(path.name.removesuffix(".json") + ".round.json")


def prune_round(report_path: str | Path) -> int:
    """The rerun trigger of a prune job (``prune``, ``prune_keep_free``): the round its last job recorded
    (``prune_round_path``; 1 without one), plus one while a payload file that was gone when that job
    finished (freed by it, by a killed prune, or by hand) is on disk again (a restore, a fetch into the
    artifact). It equals the round the last job was given (and recorded) until such a payload comes back,
    so a restore makes the prune pending again, as a publication does. It is
    read from a file Snakemake never deletes: a job's params are evaluated again after its outputs are gone."""
    try:
        record = json.loads(prune_round_path(report_path).read_bytes())
        number = int(record["round"])
        removed = [Path(p) for p in record["removed"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return 1
    return number + 1 if any(os.path.lexists(p) for p in removed) else number


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


def scrub_slice_name(subset: str | None) -> str:
    """The scrub report's name for config ``scrub_subset``: ``all``, or ``K-of-N`` for ``K/N`` (checked)."""
    from ..archive.verify import Subset

    if subset is None:
        return "all"
    parsed = Subset.parse(str(subset))
    return f"{parsed.k}-of-{parsed.n}"


def restore_scope(runs_root: str | Path, run: str | None) -> list[tuple[str, str, bool]]:
    """``(run, iter_N, pruned)`` of every committed artifact of ``run`` (None: of every run); ``pruned``: it
    has a receipt and lacks a payload file, so ``restore_all`` refills it. Stats only; restore re-judges."""
    from ..archive.restore import missing_payloads

    wanted = run.strip("/") if run else None
    return [(r, name, bool(missing_payloads(Path(artifact_path(str(runs_root), r, name)))))
            for r, name in committed_artifacts(runs_root) if wanted in (None, r)]


def restore_inputs(artifact_dir: str) -> list[str]:
    """The restore job's inputs: the artifact directory and each existing directory that lacks one of its
    payload files. Removing a file changes its directory's mtime, so a restore report older than that
    reruns; a fully pruned artifact has only its top directory, before and after, so the set is stable."""
    from ..archive.restore import missing_payloads

    dirs = {os.path.dirname(f"{artifact_dir}/{rel}") for rel in missing_payloads(Path(artifact_dir))}
    return [artifact_dir, *sorted(d for d in dirs - {artifact_dir} if os.path.isdir(d))]


def keep_free_target(config: Mapping[str, Any]) -> Any:
    """``prune: {keep_free}`` of a normalised configuration, parsed (``archive.keep_free.parse_target``; a wrong
    spelling is a usage error at planning), or None: ``prune_all`` then prunes every verified artifact."""
    from ..archive.keep_free import parse_target

    value = (config.get("prune") or {}).get("keep_free")
    return None if value is None else parse_target(value)


_shown: set[str] = set()  # tables already printed by this Snakemake process (planning may ask twice)


def show_status(runs_root: str, reports_dir: str, stage_dir: str, teachers_dir: str, out_json: str, out_txt: str,
                *, executing: bool) -> Any:
    """The status table while Snakemake plans the status job (``Plan.records_fingerprint``): when Snakemake will
    execute (a run or a dry-run), the current table on stdout, once per process, whether or not the job
    runs; when it plans without executing (``--report``, ``--summary``, ``--dag``), the table files
    rewritten if they differ from the current table, so what those read is current. Returns the status
    (``records_fingerprint`` digests it)."""
    from ..status import collect_status

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


def _report_value(report_path: str | Path, key: str, kind: type) -> Any:
    """``key`` of the step report at ``report_path`` when it is a ``kind``; None when the report is
    missing or unreadable, or holds no such value."""
    try:
        value = json.loads(Path(report_path).read_bytes()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, kind) else None


def report_batch(report_path: str | Path) -> str | None:
    """The batch a step report came from (``batch`` in the report), None for a job that ran alone."""
    return _report_value(report_path, "batch", str)


def report_round(report_path: str | Path) -> int | None:
    """The round a prune report records (``prune_round``), None when it records none."""
    return _report_value(report_path, "round", int)
