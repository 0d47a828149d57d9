"""The library side of the Snakemake steps: one function per rule, called by the ``scripts/`` shims.

Snakemake decides what is pending (a rule's marker is missing or older than its input); these
functions decide what is safe, with exactly the guarantees of the CLI verbs. A step that cannot
complete raises, so Snakemake marks the job failed and removes its declared output; the library's own
records (manifest, receipt) are never declared outputs that a rerun could make it forget, except the
receipt, which publication re-derives from the archive (an identical committed archive is adopted).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from .errors import VerificationFailed
from .fsutil import atomic_write_bytes
from .jsonio import encode_json
from .store.open import open_bucket_arg, store_factory

log = logging.getLogger(__name__)


def _write_report(path: Path | str, report: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, encode_json(report))


def publish_step(artifact_dir: str, upload_prefix: str, bucket: str | None, credentials: str | None) -> dict[str, Any]:
    """Publish one artifact; its ``.uploaded`` receipt is the rule's output."""
    from .archive.publish import publish_artifact

    store = open_bucket_arg(bucket, credentials)
    result = publish_artifact(Path(artifact_dir), store, upload_prefix, progress=False)
    log.info("publish %s: %s", artifact_dir, result.status)
    return result.to_report()


def verify_step(artifact_dir: str, credentials: str | None, report_path: str) -> dict[str, Any]:
    """Verify one published artifact and write the report; a failed verification fails the job."""
    from .archive.verify import verify_artifact

    result = verify_artifact(Path(artifact_dir), store_factory(credentials))
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
