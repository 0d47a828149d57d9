"""Reading the state of every iteration from the records: ``collect_status`` (see the package docstring)."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from ..archive.release import dead_asides
from ..archive.verify import verify_artifact
from ..artifact import ARTIFACTS_DIR, ITER_DIR_RE, RUN_DEPTH, changed_payloads, changed_remedy, find_runs
from ..digest import sha256_bytes
from ..errors import CkptflowError, NotFound, Refused
from ..fsutil import require_directory
from ..materialize.hf_source import source_sha256 as trainer_source_sha256
from ..records import (
    MANIFEST_FILENAME,
    MATERIALIZED_FILENAME,
    MERGE_RECORD_FILENAME,
    RECEIPT_FILENAME,
    STAGING_FILENAME,
    LegacyRecord,
    merge_progress,
    payload_bytes,
    read_materialized,
    read_merge_record,
    read_staging,
    utc_timestamp,
)
from ..records import verification as verification_record
from ..records.inventory import FileEntry
from ..records.manifest import DcpComponent, Manifest, parse_manifest
from ..records.receipt import check_belongs, read_receipt_digest
from ..records.step_report import read_step_report
from .report import CORRUPT, NONE, Row, StatusReport, cell

T = TypeVar("T")
_REPORT_RE = re.compile(r"^iter_(\d+)\.json$")


def _mtime(seconds: float) -> str:
    return utc_timestamp(datetime.fromtimestamp(seconds, timezone.utc))


def collect_status(
    root: Path,
    *,
    reports_dir: Path | None = None,
    stage_dir: Path | None = None,
    teachers_dir: Path | None = None,
    verify_with: Callable[[Any], Any] | None = None,
) -> StatusReport:
    """Read the state of every iteration under ``root`` (a runs root or one run directory).

    ``verify_with`` is a ``store_for(destination)`` callable (``store.open.store_factory``); with it,
    every ``.uploaded`` is verified live against the store instead of read from a verify report.
    """
    root = require_directory(root, "runs root or run directory",
                             "pass a runs root or one run directory <project>/<group>/<run>/<ts>")
    rows: dict[tuple[str, int], Row] = {}

    def row(run: str, iteration: int, name: str) -> Row:
        return rows.setdefault((run, iteration), Row(run, iteration, name))

    if (root / ARTIFACTS_DIR).is_dir():
        scope: str | None = "/".join(root.resolve().parts[-RUN_DEPTH:])
        runs = {scope: root}
    else:
        scope, runs = None, find_runs(root)
    for run, run_dir in runs.items():
        for iteration, name, path in _iter_entries(run_dir / ARTIFACTS_DIR, ITER_DIR_RE, dirs=True):
            r = row(run, iteration, name)
            r.artifact_dir = path
            _read_artifact(r, path)
    for base, reader, pattern, dirs in (
        (reports_dir and Path(reports_dir) / "verify", _read_verify_report, _REPORT_RE, False),
        (reports_dir and Path(reports_dir) / "prune", _read_prune_report, _REPORT_RE, False),
        (stage_dir, _read_staged, ITER_DIR_RE, True),
        (teachers_dir, _read_teacher, ITER_DIR_RE, True),
    ):
        if base is not None:
            for run, iteration, name, path in _find_iters(Path(base), scope, pattern, dirs=dirs):
                reader(row(run, iteration, name.removesuffix(".json")), path)
    ordered = [rows[k] for k in sorted(rows)]
    for r in ordered:
        _check_teacher_source(r)
    if verify_with is not None:
        for r in ordered:
            if r.artifact_dir is not None and r.published["state"] != NONE:
                _verify_live(r, verify_with)
    return StatusReport(Path(root), ordered, _path(reports_dir), _path(stage_dir), _path(teachers_dir),
                        live=verify_with is not None)


def _path(value: Path | str | None) -> Path | None:
    return Path(value) if value is not None else None


def _iter_entries(directory: Path, pattern: re.Pattern[str], *, dirs: bool) -> Iterator[tuple[int, str, Path]]:
    """(iteration, name, path) of the entries of ``directory`` that match ``pattern`` (directories or files)."""
    try:
        entries = list(os.scandir(directory))
    except OSError:  # absent (nothing staged yet) or unreadable: no entries to show
        return
    for entry in entries:
        m = pattern.match(entry.name)
        if m and (entry.is_dir() if dirs else entry.is_file()):
            yield int(m.group(1)), entry.name, Path(entry.path)


def _find_iters(base: Path, scope: str | None, pattern: re.Pattern[str], *, dirs: bool
                ) -> Iterator[tuple[str, int, str, Path]]:
    """(run, iteration, name, path) of every ``iter_N`` entry in ``base/<run>/``; with ``scope``, of that
    one run only. Hidden names (temporaries) and the inside of ``iter_N`` directories are not walked."""
    if scope is not None:
        for iteration, name, path in _iter_entries(base / scope, pattern, dirs=dirs):
            yield scope, iteration, name, path
        return
    for dirpath, dirnames, _ in os.walk(base):
        here = Path(dirpath)
        if here != base:
            run = here.relative_to(base).as_posix()
            for iteration, name, path in _iter_entries(here, pattern, dirs=dirs):
                yield run, iteration, name, path
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not ITER_DIR_RE.match(d))


# ------------------------------------------------------------------------------------------ artifact


def _read_artifact(row: Row, path: Path) -> None:
    try:
        entries = {e.name: e for e in os.scandir(path)}
    except OSError as exc:
        row.local = cell(CORRUPT, f"cannot list {path}: {exc}")
        return
    manifest = _read_manifest(row, path, entries)
    _read_merge(row, path, entries)
    _read_receipt(row, path, entries, manifest)
    if verification_record.FILENAME in entries:
        _read_verification(row, path / verification_record.FILENAME)
    if manifest is not None:
        row.manifest_sha256 = sha256_bytes(manifest[0])
        _read_payloads(row, path, manifest[1])
        model = manifest[1].components.get("model")
        # a Trainer artifact's teacher records the digest of the inventory of the files it reads
        row.model_sha256 = getattr(model, "sha256", None) if model is not None else trainer_source_sha256(manifest[1])
    elif row.local["state"] != CORRUPT:
        row.local_bytes = _tree_bytes(path)


def _read_manifest(row: Row, path: Path, entries: dict[str, os.DirEntry]) -> tuple[bytes, Manifest] | None:
    """The manifest's bytes (the receipt's binding hashes them) and its record."""
    if MANIFEST_FILENAME not in entries:
        row.local = cell("incomplete", f"{path} has no {MANIFEST_FILENAME}: an interrupted save or merge")
        return None
    try:
        data = (path / MANIFEST_FILENAME).read_bytes()
        manifest = data, parse_manifest(data, what=f"`{MANIFEST_FILENAME}` in {path}")
    except LegacyRecord as exc:
        row.local = cell("legacy-manifest", str(exc))
        return None
    except (CkptflowError, OSError) as exc:
        row.local = cell(CORRUPT, str(exc))
        return None
    if merge_progress.FILENAME in entries and MERGE_RECORD_FILENAME not in entries:  # artifact.merge_in_progress
        row.local = cell("incomplete", f"{path / merge_progress.FILENAME} without {MERGE_RECORD_FILENAME}: a merge is "
                         "in progress or was killed; rerun the same merge to complete it")
        return None
    row.local = cell("committed")
    return manifest


def _read_merge(row: Row, path: Path, entries: dict[str, os.DirEntry]) -> None:
    if MERGE_RECORD_FILENAME in entries:
        try:
            request = read_merge_record(path).request
        except LegacyRecord as exc:
            row.merged = cell("legacy", str(exc))
        except (CkptflowError, OSError) as exc:
            row.merged = cell(CORRUPT, str(exc))
        else:
            row.merged = cell("merged", mode=request.mode, experts=len(request.experts), lam=request.lam)
    elif merge_progress.FILENAME in entries:
        row.merged = cell("in-progress", f"{path / merge_progress.FILENAME} exists: a merge is running or was interrupted")


def _read_receipt(row: Row, path: Path, entries: dict[str, os.DirEntry],
                  manifest: tuple[bytes, Manifest] | None) -> None:
    if RECEIPT_FILENAME not in entries:
        return
    try:
        row.receipt_mtime = entries[RECEIPT_FILENAME].stat().st_mtime
        receipt, row.receipt_sha256 = read_receipt_digest(path)
    except LegacyRecord as exc:
        row.published = cell("legacy-receipt", str(exc))
        return
    except (CkptflowError, OSError) as exc:
        row.published = cell(CORRUPT, str(exc))
        return
    try:
        check_belongs(receipt, path, manifest=manifest)
    except Refused as exc:  # e.g. a copy of another iteration's .uploaded: it proves nothing about this one
        row.published = cell("foreign", str(exc), destination=receipt.destination.to_dict(),
                             uploaded_at=receipt.uploaded_at)
        return
    row.published = cell("receipt", destination=receipt.destination.to_dict(), uploaded_at=receipt.uploaded_at)
    row.archived_bytes = payload_bytes(receipt.files)


def _payload_sizes(manifest: Manifest) -> Iterator[tuple[str, int]]:
    for comp in manifest.components.values():
        if isinstance(comp, DcpComponent):
            yield from ((f"{comp.path}/{f.path}", f.size) for f in comp.files)
        else:
            yield comp.path, comp.size


def _read_payloads(row: Row, path: Path, manifest: Manifest) -> None:
    """Local size and the pruned state from a stat of each payload file the manifest names (and of each a
    killed prune set aside under another name: its bytes are still on disk); local ``damaged`` when a file
    present is not the one the manifest committed (``artifact.changed_payloads``: its size, or a file
    modified after the commit that no longer hashes to it)."""
    missing, present = 0, 0
    total = 0
    gone = []
    for rel, _ in _payload_sizes(manifest):
        total += 1
        try:
            present += os.stat(path / rel).st_size
        except OSError:
            missing += 1
            gone.append(rel)
    asides = dead_asides(path, gone) if gone else {}
    for aside in asides:
        with contextlib.suppress(OSError):
            present += os.stat(path / aside).st_size
    row.local_bytes = present
    try:
        changed = changed_payloads(path, manifest) if missing < total else []
    except OSError as exc:
        row.local = cell(CORRUPT, f"cannot read the payloads of {path}: {exc}")
        changed = []
    if changed:
        row.local = cell("damaged", f"{_listed(changed)}: not the bytes its manifest committed; "
                         f"{changed_remedy(path)}")
    receipt = row.published["state"] == "receipt"
    if missing == 0:
        return
    if asides and receipt:
        row.pruned = cell("partial", f"{_listed(sorted(set(asides.values())))} set aside by a killed prune, its "
                          "bytes still on disk: rerun prune-verified to free them, or `ckptflow restore` to put "
                          "them back", files=missing)
    elif missing == total and receipt:
        row.pruned = cell("pruned", files=total)
    elif receipt:
        row.pruned = cell("partial", f"{missing} of {total} payload files are gone: an interrupted prune "
                          "(rerun prune-verified) or a damaged artifact (`ckptflow restore` refills it)", files=missing)
    else:
        row.pruned = cell("missing", f"{missing} of {total} payload files are gone and no receipt proves an "
                          "archived copy: restore them or fetch the artifact", files=missing)


def _listed(problems: list[str]) -> str:
    return "; ".join(problems[:3]) + (f" (+{len(problems) - 3} more)" if len(problems) > 3 else "")


def _check_files(directory: Path, files: tuple[FileEntry, ...], what: str) -> tuple[str, str] | None:
    """What a record's file list says is in ``directory``, checked by one stat per file (no hashing):
    None when every file is there at its recorded size, else ``(state, detail)``: ``damaged`` when a file
    has another size, ``partial`` when files are only missing."""
    missing, other_size = [], []
    for entry in files:
        try:
            found = os.stat(directory / entry.path).st_size
        except OSError:
            missing.append(entry.path)
            continue
        if found != entry.size:
            other_size.append(f"{directory / entry.path} has {found} bytes, {what} says {entry.size}")
    if other_size:
        return "damaged", _listed(other_size)
    if missing:
        return "partial", f"{len(missing)} of {len(files)} files {what} names are gone ({_listed(missing)})"
    return None


def _tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass  # removed while we walked
    return total


# ----------------------------------------------------------------------------- reports, stage, teacher


def _read_report(path: Path, schema: str) -> tuple[dict[str, Any], str]:
    """A workflow step report (``records.step_report``: protocol, then schema) and when it was written."""
    return read_step_report(path, schema), _mtime(path.stat().st_mtime)


def _read_verify_report(row: Row, path: Path) -> None:
    try:
        report, at = _read_report(path, "report_verify")
    except (CkptflowError, OSError) as exc:
        row.verified = cell(CORRUPT, str(exc), source="report", report=str(path))
        return
    status = report["status"]
    detail = None
    if status != "verified":
        bad = [o for o in report["objects"] if o["state"] != "ok"]
        detail = "; ".join(f"{o['key']}: {o['state']}" for o in bad[:5])
    if row.verified.get("source") == "record" and row.verified["at"] > at:
        return  # a later `ckptflow verify` of the artifact says more than this report
    stale = None
    if row.published["state"] != "receipt":
        stale, detail = True, f"the artifact holds no receipt now ({row.published['state']}): the report proves nothing"
    elif row.receipt_mtime is not None and row.receipt_mtime > path.stat().st_mtime:
        stale, detail = True, "the receipt is newer than this report: verify again"
    row.verified = cell(status, detail, source="report", at=at, report=str(path), stale=stale)


def _read_verification(row: Row, path: Path) -> None:
    """``.verified.json``: the latest ``ckptflow verify`` of the artifact, bound to the receipt's bytes."""
    try:
        record = verification_record.read_verification(path)
    except (CkptflowError, OSError) as exc:
        row.verified = cell(CORRUPT, str(exc), source="record", report=str(path))
        return
    detail = None
    if record.status != "verified":
        detail = f"{record.not_ok} of {record.objects} objects were not ok: run ckptflow verify for the list"
    stale = None
    if row.published["state"] != "receipt":
        stale, detail = True, f"the artifact holds no receipt now ({row.published['state']}): the record proves nothing"
    elif record.receipt_sha256 != row.receipt_sha256 or (row.receipt_mtime or 0) > path.stat().st_mtime:
        stale, detail = True, "the receipt is newer than this verification: verify again"
    row.verified = cell(record.status, detail, source="record", at=record.verified_at, report=str(path), stale=stale)


def _read_prune_report(row: Row, path: Path) -> None:
    try:
        report, at = _read_report(path, "report_prune_verified")
    except (CkptflowError, OSError) as exc:
        if row.pruned["state"] == NONE:
            row.pruned = cell(CORRUPT, str(exc), report=str(path))
        else:
            row.pruned.setdefault("detail", f"prune report unreadable: {exc}")
        return
    row.pruned["report"] = str(path)
    row.pruned["report_at"] = at
    kept = [k["reason"] for k in report["kept"]]
    if kept and row.pruned["state"] == NONE:
        row.pruned = cell("kept", kept[0], report=str(path), report_at=at)


def _read_commit_record(read: Callable[[Path], T], path: Path, missing: str) -> tuple[T | None, dict[str, Any]]:
    """The commit record in ``path``, or None and the cell that says why there is none: ``unrecorded``
    (no record: ``missing`` says what that means) or ``corrupt``."""
    try:
        return read(path), {}
    except NotFound:
        return None, cell("unrecorded", f"{path} has no {missing}", path=str(path))
    except (CkptflowError, OSError) as exc:
        return None, cell(CORRUPT, str(exc), path=str(path))


def _read_staged(row: Row, path: Path) -> None:
    record, row.staged = _read_commit_record(read_staging, path, f"{STAGING_FILENAME}: fetch did not write it")
    if record is not None:
        fields = {"path": str(path), "source_uri": record.source_uri, "bytes": sum(f.size for f in record.files)}
        if record.components is not None:  # a copy of named components: its files are all it vouches for
            fields["components"] = list(record.components)
        if not record.complete:
            row.staged = cell("incomplete", "fetch has not finished: rerun it to complete or clean up", **fields)
        elif problem := _check_files(path, record.files, STAGING_FILENAME):
            row.staged = cell(problem[0], problem[1] + ": fetch again to restore the stage", **fields)
        else:
            row.staged = cell("staged", **fields)


def _read_teacher(row: Row, path: Path) -> None:
    record, row.materialized = _read_commit_record(read_materialized, path, f"{MATERIALIZED_FILENAME}: not a finished build")
    if record is not None:
        fields = {"path": str(path), "source_uri": record.source.uri,
                  "source": "archive" if record.source.uri else "local", "tensors": record.tensor_count}
        row.teacher_sha256 = record.source.sha256
        problem = _check_files(path, record.shards, MATERIALIZED_FILENAME)
        row.materialized = (cell(problem[0], problem[1] + ": materialize it again (the same request rebuilds a damaged teacher)", **fields)
                            if problem else cell("materialized", **fields))


def _check_teacher_source(row: Row) -> None:
    """A teacher built from another model than the one this artifact's manifest records (e.g. from the
    archive a copied receipt named) is not this iteration's teacher: ``foreign``."""
    if row.model_sha256 is None or row.teacher_sha256 is None or row.model_sha256 == row.teacher_sha256:
        return
    if row.materialized["state"] in ("materialized", "partial", "damaged"):
        fields = {k: v for k, v in row.materialized.items() if k not in ("state", "detail")}
        row.materialized = cell("foreign", f"{row.materialized['path']} was built from a model.pt of sha256 "
                                f"{row.teacher_sha256}; the manifest of {row.artifact_dir} records {row.model_sha256}: "
                                "materialize this artifact again (with force) to replace it", **fields)


def _verify_live(row: Row, verify_with: Callable[[Any], Any]) -> None:
    at = utc_timestamp()
    try:
        result = verify_artifact(row.artifact_dir, verify_with)
    except (CkptflowError, OSError) as exc:
        row.verified = cell("error", str(exc), source="live", at=at)
        return
    detail = None if result.ok else "at " + "; at ".join(result.failures())  # each destination's copy
    row.verified = cell("verified" if result.ok else "failed", detail, source="live", at=at)
