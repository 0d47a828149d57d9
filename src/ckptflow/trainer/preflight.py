"""Fail fast at start: check the upload destination before the first training step.

``preflight(run_dir, upload)`` asks, in order, what the first publication would find out hours later:

1. the upload prefix: derived from the run directory, or ``upload.prefix`` consistent with it
   (``keys.upload_prefix_for``, the CLI's derivation and refusal);
2. the credentials, from the documented sources (``UploadSettings.credentials``, else
   ``$CKPTFLOW_CREDENTIALS``, else botocore's chain for ``s3``; none for ``file://``), and the bucket: it must
   exist (``store.open.open_bucket_arg``, as ``ckptflow publish`` opens it);
3. that the credentials are accepted: one HEAD under the prefix (HeadBucket alone may answer 403 to a caller
   allowed to write under a prefix, and is then taken as existing);
4. that the endpoint enforces create-once: a passing probe record for its endpoint + bucket, probing once when
   none is cached (``archive.probe.require_qualified``, the check ``publish --delete-local`` makes).

The first problem found raises ``PreflightFailed``: one line naming it and the remedy; nothing is written
except the probe's scratch objects (removed again) and its cached record. An endpoint that cannot be reached
is only a warning, logged and returned: training may go on and publish later (a failed publication keeps
the artifact and logs the command that publishes it); ``strict`` (or ``UploadSettings.strict``) makes it a
``PreflightFailed`` too.

In a process group the checks run on rank 0 only and its outcome is broadcast: every rank returns the same
result or raises the same ``PreflightFailed``; the other ranks never open a store. The call is then
collective (every rank makes it). ``save_and_publish`` runs it on its first call for a run when
``UploadSettings.preflight`` is set, unless it already ran (``preflight_once``).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from ..archive.probe import require_qualified
from ..errors import CkptflowError, EndpointUnreachable, PreflightFailed
from ..records import probe as probe_record
from ..store.base import ObjectStore
from ..store.open import open_bucket_arg
from ..store.uri import destination_label
from .publish import UploadSettings
from .ranks import Ranks
from .write import artifact_dir_for

log = logging.getLogger(__name__)

CREDENTIALS_KEY = ".ckptflow-preflight"  # HEADed under the prefix (never written): do the credentials work?


@dataclass(frozen=True)
class PreflightResult:
    """What the destination check found. ``destination`` names the endpoint and bucket (no secret)."""

    prefix: str | None = None  # the upload prefix; None when upload is disabled
    destination: str | None = None  # None when disabled or not reached
    probed: bool = False  # the endpoint was probed now (no cached probe record)
    warning: str | None = None  # the endpoint could not be reached (not strict): training goes on

    @property
    def checked(self) -> bool:
        """Every check passed (False when disabled, or unreachable)."""
        return self.destination is not None and self.warning is None


_DONE: set[tuple[Path, UploadSettings]] = set()
_DONE_LOCK = threading.Lock()


def preflight(run_dir: Path | str, upload: UploadSettings, *, strict: bool | None = None,
              collective: bool | None = None) -> PreflightResult:
    """Check ``upload``'s destination for the artifacts of ``run_dir``; raise ``PreflightFailed`` naming the
    first problem and its remedy. ``strict`` None: ``upload.strict``. ``collective=False``: a process that
    checks alone although a process group is initialised (``ranks.Ranks.current``)."""
    strict = upload.strict if strict is None else strict
    if not upload.enabled:
        return PreflightResult()
    ranks = Ranks.current(collective)
    outcome: tuple[PreflightResult | None, str | None, str | None] = (None, None, None)
    if ranks.is_main:
        try:
            outcome = _check(Path(run_dir), upload, strict)
        except Exception as exc:
            if not ranks.collective:
                raise
            # the other ranks wait for rank 0's outcome: they learn this failure instead of hanging
            outcome = (None, f"upload destination of {run_dir}: {type(exc).__name__}: {exc}", None)
    result, message, remedy = ranks.broadcast(outcome)
    if message is not None:
        raise PreflightFailed(message, remedy=remedy)
    with _DONE_LOCK:
        _DONE.add((Path(run_dir).resolve(), upload))
    return result


def preflight_once(run_dir: Path | str, upload: UploadSettings, *,
                   collective: bool | None = None) -> PreflightResult | None:
    """``preflight`` unless it already passed (or warned) for this run and these settings; None then."""
    with _DONE_LOCK:
        if (Path(run_dir).resolve(), upload) in _DONE:
            return None
    return preflight(run_dir, upload, collective=collective)


def _check(run_dir: Path, upload: UploadSettings, strict: bool) -> tuple[PreflightResult | None, str | None,
                                                                          str | None]:
    """(result, None, None) when the destination takes the run's artifacts (or is unreachable, not strict);
    (None, message, remedy) for the first problem found."""
    what, prefix = f"upload destination of {run_dir}", None
    try:
        prefix = upload.prefix_for(artifact_dir_for(run_dir, 0))
        store = open_bucket_arg(upload.bucket, upload.credentials)
        label = destination_label(store.destination)
        what = f"upload destination {destination_label(store.destination, prefix)} of {run_dir}"
        store.head(f"{prefix}/{CREDENTIALS_KEY}")
        probed = _probed(store, prefix)
    except EndpointUnreachable as exc:
        line = f"{what}: {exc.message}"
        if strict:
            return None, f"{line} (strict preflight); training does not start", exc.remedy
        log.warning("%s; training goes on, and each save's publication is tried and logged: %s", line, exc.remedy)
        return PreflightResult(prefix=prefix, warning=f"{line}; {exc.remedy}"), None, None
    except CkptflowError as exc:
        return None, f"{what}: {exc.message}; training does not start", exc.remedy
    except OSError as exc:
        return None, f"{what}: {exc}; training does not start", "check the credentials file and the bucket"
    log.info("%s: ready (prefix derived or consistent, credentials accepted, bucket present, create-once "
             "enforced%s)", what, ", probed now" if probed else "")
    return PreflightResult(prefix=prefix, destination=label, probed=probed), None, None


def _probed(store: ObjectStore, prefix: str) -> bool:
    """``require_qualified`` (raises when the endpoint does not enforce create-once); whether it probed."""
    cached = probe_record.read_probe_record(store.destination.as_dict()) is not None
    require_qualified(store, prefix)
    return not cached
