"""Trainer-side API: publish a freshly committed artifact without ever failing the training run.

A trainer that saves ``checkpoint_artifacts/iter_N`` calls ``trainer_publish`` after committing the
manifest. Archive failures (endpoint down, refused declaration, verification failure) are logged and
returned, never raised: the local artifact stays untouched and can be published later with
``ckptflow publish`` (or the workflow's ``publish_all``). The command line reports the same failures as
a failed command (exit 1) instead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from .archive.publish import PublishResult, publish_artifact
from .errors import CkptflowError
from .store.base import ObjectStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainerPublishOutcome:
    result: PublishResult | None
    error: str | None  # one line naming what failed and the remedy; None when published

    @property
    def ok(self) -> bool:
        return self.error is None


def trainer_publish(
    artifact_dir: Path | str, store: ObjectStore, upload_prefix: str, *, delete_local: bool = False
) -> TrainerPublishOutcome:
    """``publish_artifact`` for a training loop: failures are captured and logged, the artifact kept."""
    try:
        result = publish_artifact(artifact_dir, store, upload_prefix, delete_local=delete_local, progress=False)
    except (CkptflowError, OSError) as exc:
        line = f"archiving {artifact_dir} failed, the local artifact is kept: {exc}"
        log.error("%s; publish it later with `ckptflow publish --artifact-dir %s`", line, artifact_dir)
        return TrainerPublishOutcome(result=None, error=line)
    log.info("archived %s: %s", artifact_dir, result.status)
    return TrainerPublishOutcome(result=result, error=None)
