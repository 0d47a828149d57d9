"""Trainer-side publication: archive a freshly committed artifact without ever failing or stopping training.

``trainer_publish`` publishes one committed artifact through the same ``publish_artifact`` the CLI uses.
Archive failures (endpoint down, refused declaration, verification failure) are logged with their reason
and the exact command that retries them, and returned, never raised: the local artifact stays untouched
and can be published later with ``ckptflow publish`` (or the workflow's ``snakemake publish_all``). The
command line reports the same failures as a failed command (exit 1) instead. A publication that fails
while another publisher receipts the same artifact (the workflow's ``publish_all``, then perhaps a prune
removing the payloads it was reading) is run once more: it adopts that archive and is reported as
archived, not as a failure.

``save_and_publish`` writes an artifact (``write.write_artifact``) and hands it to the run's
``BackgroundPublisher``: one thread per run directory, at most one publication in flight, later saves queued
in order, so a training step is never blocked by an upload. ``wait_for_publications`` (or
``BackgroundPublisher.wait``) blocks at the end of training until the queue is empty.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import testhooks
from ..archive.keys import upload_prefix_for
from ..archive.publish import PublishResult, publish_artifact
from ..errors import CkptflowError
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from ..store.base import ObjectStore
from .async_save import settle as settle_saves
from .ranks import Ranks
from .resume import committed_artifacts
from .write import artifact_dir_for, write_artifact

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainerPublishOutcome:
    result: PublishResult | None
    error: str | None  # one line naming what failed and the remedy; None when published
    artifact_dir: Path | None = None
    retry: str | None = None  # the exact command that publishes the kept artifact later

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class UploadSettings:
    """The trainer's upload settings: the CLI's ``--bucket``, ``--credentials`` and ``--upload-prefix``."""

    enabled: bool = False
    bucket: str | None = None  # a bucket name (S3) or s3://B, gs://B, file:///DIR
    credentials: str | None = None  # path of the credentials JSON (never its content)
    prefix: str | None = None  # <project>/<group>/<run>/<ts>/checkpoints; None: derived from the artifact's path
    # trainer.preflight checks the destination before the first step (a loop's own call, the HF callback's
    # train begin, else the run's first save_and_publish); False: no check, an explicit choice
    preflight: bool = True
    strict: bool = False  # preflight: an endpoint that cannot be reached fails too (else a warning)

    def prefix_for(self, artifact_dir: Path | str) -> str:
        """The upload prefix of ``artifact_dir``: the CLI's derivation and refusal (``keys.upload_prefix_for``)."""
        return upload_prefix_for(artifact_dir, self.prefix)

    def retry_command(self, artifact_dir: Path | str) -> str:
        words = ["ckptflow", "publish", "--artifact-dir", str(artifact_dir)]
        if self.prefix:
            words += ["--upload-prefix", self.prefix]
        if self.bucket:
            words += ["--bucket", self.bucket]
        if self.credentials:
            words += ["--credentials", str(self.credentials)]
        return shlex.join(words)

    def open_store(self) -> ObjectStore:
        from ..store.open import open_bucket_arg

        return open_bucket_arg(self.bucket, self.credentials)


def trainer_publish(
    artifact_dir: Path | str, store: ObjectStore, upload_prefix: str | None, *, delete_local: bool = False,
    retry: str | None = None,
) -> TrainerPublishOutcome:
    """``publish_artifact`` for a training loop: failures are captured and logged, the artifact kept.
    ``upload_prefix`` None: derived from the artifact's path, as the CLI does."""
    retry = retry or shlex.join(["ckptflow", "publish", "--artifact-dir", str(artifact_dir),
                                 *(["--upload-prefix", upload_prefix] if upload_prefix else [])])
    receipt = receipt_record.path_in(artifact_dir)
    had_receipt = _state(receipt)
    try:
        result = publish_artifact(artifact_dir, store, upload_prefix, delete_local=delete_local, progress=False)
    except (CkptflowError, OSError) as exc:
        if _state(receipt) not in (None, had_receipt):
            # Another publisher (the workflow's publish_all, a `ckptflow publish`) committed and receipted the
            # artifact meanwhile, and a prune may then have removed the payloads this one was reading. The
            # same publication once more tells which: it adopts that archive (nothing uploaded) or fails.
            with contextlib.suppress(CkptflowError, OSError):
                result = publish_artifact(artifact_dir, store, upload_prefix, progress=False)
                dest = result.destination
                log.info("archived %s by another publisher while this one ran (%s at %s://%s/%s); this "
                         "publication had stopped on: %s", artifact_dir, result.status, dest.scheme, dest.bucket,
                         dest.prefix, exc)
                return TrainerPublishOutcome(result=result, error=None, artifact_dir=Path(artifact_dir), retry=retry)
        line = f"archiving {artifact_dir} failed, the local artifact is kept: {exc}"
        log.error("%s; publish it later with `%s` or `snakemake publish_all`", line, retry)
        return TrainerPublishOutcome(result=None, error=line, artifact_dir=Path(artifact_dir), retry=retry)
    log.info("archived %s: %s", artifact_dir, result.status)
    return TrainerPublishOutcome(result=result, error=None, artifact_dir=Path(artifact_dir), retry=retry)


def _state(path: Path) -> tuple | None:
    """(inode, size, mtime) of a receipt, None when absent: tells whether one was written meanwhile."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass
class BackgroundPublisher:
    """One publication in flight per run; saves submitted meanwhile wait in order."""

    upload: UploadSettings
    outcomes: list[TrainerPublishOutcome] = field(default_factory=list)
    _queue: list[Path] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _busy: bool = False
    _current: Path | None = None
    _thread: threading.Thread | None = None

    def submit(self, artifact_dir: Path | str) -> None:
        with self._cond:
            if Path(artifact_dir) in (*self._queue, self._current):
                return  # already waiting or in flight (queued by publish_pending, then saved)
            self._queue.append(Path(artifact_dir))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ckptflow-publish", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue) + (1 if self._busy else 0)

    def wait(self, timeout: float | None = None) -> list[TrainerPublishOutcome]:
        """Block until every submitted artifact was published or failed; returns every outcome so far."""
        with self._cond:
            self._cond.wait_for(lambda: not self._queue and not self._busy, timeout=timeout)
            return list(self.outcomes)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    return  # a later submit starts a new thread
                art = self._current = self._queue.pop(0)
                self._busy = True
            outcome = None
            try:
                outcome = self._publish_one(art)
            except Exception as exc:  # an unexpected failure must not end training either
                retry = self.upload.retry_command(art)
                line = f"archiving {art} failed unexpectedly, the local artifact is kept: {type(exc).__name__}: {exc}"
                log.exception("%s; publish it later with `%s` or `snakemake publish_all`", line, retry)
                outcome = TrainerPublishOutcome(result=None, error=line, artifact_dir=art, retry=retry)
            finally:
                with self._cond:  # the outcome is recorded before wait() can see the publisher idle
                    if outcome is not None:
                        self.outcomes.append(outcome)
                    self._busy, self._current = False, None
                    self._cond.notify_all()

    def _publish_one(self, art: Path) -> TrainerPublishOutcome:
        retry = self.upload.retry_command(art)
        testhooks.reached("trainer:before-publish")
        try:
            store = self.upload.open_store()
        except (CkptflowError, OSError) as exc:
            line = f"archiving {art} failed, the local artifact is kept: {exc}"
            log.error("%s; publish it later with `%s` or `snakemake publish_all`", line, retry)
            return TrainerPublishOutcome(result=None, error=line, artifact_dir=art, retry=retry)
        return trainer_publish(art, store, self.upload.prefix or None, retry=retry)


_PUBLISHERS: dict[Path, BackgroundPublisher] = {}
_PUBLISHERS_LOCK = threading.Lock()


def publisher_for(run_dir: Path | str, upload: UploadSettings) -> BackgroundPublisher:
    """The run's publisher (one per resolved run directory)."""
    key = Path(run_dir).resolve()
    with _PUBLISHERS_LOCK:
        pub = _PUBLISHERS.get(key)
        if pub is None or pub.upload != upload:
            if pub is not None:
                pub.wait()
            pub = _PUBLISHERS[key] = BackgroundPublisher(upload)
        return pub


def save_and_publish(
    run_dir: Path | str, iteration: int, components: Mapping[str, Any], upload: UploadSettings, *,
    collective: bool | None = None, asynchronous: bool = False,
) -> Any:
    """Write the artifact now; when upload is enabled, queue its publication on the run's background
    publisher and return at once. A write failure raises (the save did not happen); a publication
    failure is logged with the retry command and never raises.

    ``asynchronous=True`` (one process): stage the state, return a ``SaveHandle`` at once, and write,
    commit and queue the publication on a background thread (``async_save``); a failure there raises at
    the handle's ``result()``, at the run's next save or at ``wait_for_publications``."""
    if asynchronous:
        from .async_save import save_in_background

        def publish(manifest: manifest_record.Manifest) -> None:  # on the background thread, rank 0 only
            _publish_saved(run_dir, iteration, manifest, upload, False)

        return save_in_background(run_dir, iteration, components, collective=collective,
                                  then=publish if Ranks.current(collective).is_main else None)
    manifest = write_artifact(run_dir, iteration, components, collective=collective)
    return _publish_saved(run_dir, iteration, manifest, upload, collective)


def _publish_saved(run_dir: Path | str, iteration: int, manifest: manifest_record.Manifest, upload: UploadSettings,
                   collective: bool | None) -> manifest_record.Manifest:
    """What ``save_and_publish`` does once the artifact is committed: preflight on first use, the run's
    earlier unpublished artifacts, then this one, queued on the background publisher."""
    testhooks.reached("trainer:after-save")
    if upload.enabled and upload.preflight:  # first use: the destination is checked before anything is queued
        from .preflight import preflight_once

        try:
            preflight_once(run_dir, upload, collective=collective)
        except CkptflowError as exc:
            exc.add_context(after=f" ({artifact_dir_for(run_dir, iteration)} is committed and kept)")
            raise
    if not Ranks.current(collective).is_main:
        return manifest  # collective: publication and the store are rank 0's (preflight above is collective)
    art = artifact_dir_for(run_dir, iteration)
    queued: list[Path] = []
    if upload.enabled and Path(run_dir).resolve() not in _CAUGHT_UP:
        queued = publish_pending(run_dir, upload, collective=False)  # the run's earlier unpublished artifacts first
    # publish_pending queued this one too when it found it committed: queued again, a publication that had
    # already ended (a quick failure) would run a second time.
    if art not in queued:
        publish_in_background(run_dir, art, upload)
    return manifest


_CAUGHT_UP: set[Path] = set()


def publish_pending(run_dir: Path | str, upload: UploadSettings, *, collective: bool | None = None) -> list[Path]:
    """Queue on rank 0 the background publication of every committed artifact of the attempt ``run_dir`` that
    has no receipt, oldest first (a publication a killed or requeued job did not finish, or one that
    failed); returns them. Called at the start of a job, and by the first ``save_and_publish`` of a run in
    this process. Other ranks, and an upload that is not enabled: nothing, []."""
    if not upload.enabled or not Ranks.current(collective).is_main:
        return []
    _CAUGHT_UP.add(Path(run_dir).resolve())
    pending = [art for art in committed_artifacts(Path(run_dir)).values()
               if not os.path.lexists(receipt_record.path_in(art))]
    for art in pending:
        log.info("%s is committed without a receipt: publishing it in the background", art)
        publish_in_background(run_dir, art, upload)
    return pending


def publish_in_background(run_dir: Path | str, artifact_dir: Path, upload: UploadSettings) -> None:
    """Queue a committed artifact on the run's background publisher when upload is enabled; a prefix the
    CLI would refuse is logged with the retry command and nothing is queued."""
    if not upload.enabled:
        return
    try:
        upload.prefix_for(artifact_dir)  # the CLI's refusal, before anything is queued
    except CkptflowError as exc:
        log.error("%s is kept locally, not archived: %s; publish it with `%s`", artifact_dir, exc,
                  upload.retry_command(artifact_dir))
    else:
        publisher_for(run_dir, upload).submit(artifact_dir)


def wait_for_publications(run_dir: Path | str | None = None, timeout: float | None = None, *,
                          collective: bool | None = None) -> list[TrainerPublishOutcome]:
    """Block until the publications of ``run_dir`` (every run when None) are done; returns their outcomes.
    Collective-safe: only rank 0 publishes, so only rank 0 waits; the other ranks return [] at once.
    This process's asynchronous saves of the run are waited for first (their publications are queued at
    their commit); the first background failure not yet reported raises here (``BackgroundSaveFailed``)."""
    settle_saves(run_dir, timeout)
    if not Ranks.current(collective).is_main:
        return []
    with _PUBLISHERS_LOCK:
        pubs = [p for k, p in _PUBLISHERS.items() if run_dir is None or k == Path(run_dir).resolve()]
    return [o for p in pubs for o in p.wait(timeout)]
