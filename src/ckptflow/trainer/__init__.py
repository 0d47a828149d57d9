"""The training side: write an artifact at every save, publish it in the background, refuse a cold
restart over a committed artifact, and keep full checkpoints under their own retention. With a process
group of several ranks initialised, saves, the resume guard and the waits are collective (``ranks``).

torch is imported only inside the functions that need it, so ``import ckptflow.trainer`` works without it.
"""

from __future__ import annotations

from .async_save import BackgroundSaveFailed, SaveHandle
from .checkpoints import begin_checkpoint_save, finish_checkpoint_save
from .preflight import PreflightResult, preflight
from .publish import (
    BackgroundPublisher,
    TrainerPublishOutcome,
    UploadSettings,
    publish_pending,
    publisher_for,
    save_and_publish,
    trainer_publish,
    wait_for_publications,
)
from .ranks import RankFailed
from .resume import pin_run_attempt
from .retention import observe_checkpoint, retain_checkpoints, write_checkpoint_receipt
from .write import artifact_dir_for, write_artifact

__all__ = [
    "BackgroundPublisher", "BackgroundSaveFailed", "PreflightResult", "RankFailed", "SaveHandle",
    "TrainerPublishOutcome", "UploadSettings",
    "artifact_dir_for", "begin_checkpoint_save", "finish_checkpoint_save", "observe_checkpoint", "pin_run_attempt",
    "preflight", "publish_pending", "publisher_for", "retain_checkpoints", "save_and_publish", "trainer_publish",
    "wait_for_publications", "write_artifact", "write_checkpoint_receipt",
]
