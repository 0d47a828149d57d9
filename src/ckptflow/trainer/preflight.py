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
except the probe's scratch objects (removed again) and its cached record. What is certainly wrong (no such
bucket, credentials the endpoint rejects, a prefix of another run) is refused. An endpoint that cannot be
reached, or does not answer, may heal: it is only a warning, logged and returned, and training may go on and
publish later (a failed publication keeps the artifact and logs the command that publishes it); ``strict``
(or ``UploadSettings.strict``) makes it a ``PreflightFailed`` too.

It answers within 30 s whatever the endpoint does: its store makes each request at most
``store.open.CHECK_BOUNDS.attempts`` times, each bounded in connecting and in reading (a server that accepts
connections and never answers costs seconds, not botocore's 8 attempts of 60 s), and the whole check has
``CHECK_DEADLINE_S``: one still running then is left to finish in the background and answered as an endpoint
that did not answer in time.

In a process group the checks run on rank 0 only and its outcome is broadcast: every rank returns the same
result or raises the same ``PreflightFailed``; the other ranks never open a store. The call is then
collective (every rank makes it). It is on by default (``UploadSettings.preflight``; ``False`` turns it
off): a loop calls it before its first step, the Hugging Face callback at train begin, and
``save_and_publish`` on its first call for a run unless it already ran (``preflight_once``).
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
from ..store.open import CHECK_BOUNDS, open_bucket_arg
from ..store.uri import destination_label
from .publish import UploadSettings
from .ranks import Ranks
from .write import artifact_dir_for

log = logging.getLogger(__name__)

CREDENTIALS_KEY = ".ckptflow-preflight"  # HEADed under the prefix (never written): do the credentials work?
# The whole check, every request of it (CHECK_BOUNDS each) and the probe included; with opening the store and
# the broadcast around it, the answer comes within 30 s.
CHECK_DEADLINE_S = 25.0


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
    """``_examine`` within ``CHECK_DEADLINE_S``: a check still running then is an endpoint that did not answer
    in time (a warning unless strict), and the thread running it is left to end by its own bounds."""
    answer: list[tuple[tuple | None, BaseException | None]] = []

    def examine() -> None:
        try:
            answer.append((_examine(run_dir, upload, strict), None))
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            answer.append((None, exc))

    worker = threading.Thread(target=examine, name="ckptflow-preflight", daemon=True)
    worker.start()
    worker.join(CHECK_DEADLINE_S)
    if not answer:
        prefix = upload.prefix_for(artifact_dir_for(run_dir, 0))  # derived in the check already: no I/O
        bounds = CHECK_BOUNDS
        line = (f"upload destination of {run_dir}: the endpoint did not complete the check within "
                f"{CHECK_DEADLINE_S:g} s (each request {bounds.attempts} attempt(s), {bounds.connect_s:g} s to "
                f"connect, {bounds.read_s:g} s per read)")
        return _logged(_unreachable(line, "check endpoint_url in the credentials file and that the server is up "
                                    "and answering", prefix, strict))
    outcome, exc = answer[0]
    if exc is not None:
        raise exc
    return _logged(outcome)


def _logged(outcome: tuple[PreflightResult | None, str | None, str | None]) -> tuple[PreflightResult | None,
                                                                                    str | None, str | None]:
    """Log the warning of an answer, by the thread that takes it (a check abandoned at its deadline that
    fails later says nothing more)."""
    result = outcome[0]
    if result is not None and result.warning:
        log.warning("%s (training goes on, and each save's publication is tried and logged)", result.warning)
    return outcome


def _unreachable(line: str, remedy: str, prefix: str | None, strict: bool) -> tuple[PreflightResult | None,
                                                                                    str | None, str | None]:
    """What may heal: a warning (training goes on), or under ``strict`` a refusal."""
    if strict:
        return None, f"{line} (strict preflight); training does not start", remedy
    return PreflightResult(prefix=prefix, warning=f"{line}; {remedy}"), None, None


def _examine(run_dir: Path, upload: UploadSettings, strict: bool) -> tuple[PreflightResult | None, str | None,
                                                                            str | None]:
    """(result, None, None) when the destination takes the run's artifacts (or is unreachable, not strict);
    (None, message, remedy) for the first problem found."""
    what, prefix = f"upload destination of {run_dir}", None
    try:
        prefix = upload.prefix_for(artifact_dir_for(run_dir, 0))
        store = open_bucket_arg(upload.bucket, upload.credentials, bounds=CHECK_BOUNDS)
        label = destination_label(store.destination)
        what = f"upload destination {destination_label(store.destination, prefix)} of {run_dir}"
        store.head(f"{prefix}/{CREDENTIALS_KEY}")
        probed = _probed(store, prefix)
    except EndpointUnreachable as exc:
        return _unreachable(f"{what}: {exc.message}", exc.remedy, prefix, strict)
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
