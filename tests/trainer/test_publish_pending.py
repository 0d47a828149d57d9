"""publish_pending: what a killed job committed but did not publish is published at the next start, once;
and a process acting alone (no process group) keeps every single-process behaviour (``ranks.Ranks``)."""

from __future__ import annotations

import pytest
from trainer_helpers import tiny_training

from ckptflow.errors import Refused
from ckptflow.trainer import (
    UploadSettings,
    artifact_dir_for,
    publish_pending,
    save_and_publish,
    wait_for_publications,
    write_artifact,
)
from ckptflow.trainer.ranks import Ranks

RUN = "proj/grp/run1/20261129T000000Z"


def test_publish_pending_publishes_each_committed_artifact_without_a_receipt_once_oldest_first(tmp_path):
    run, store = tmp_path / "runs" / RUN, tmp_path / "store"
    store.mkdir()
    upload = UploadSettings(enabled=True, bucket=f"file://{store}")
    model, _ = tiny_training()
    for it in (2, 4):
        write_artifact(run, it, {"model": model})  # committed by a job killed before publishing them
    (artifact_dir_for(run, 6)).mkdir(parents=True)  # an interrupted save: never published
    assert [p.name for p in publish_pending(run, upload)] == ["iter_000002", "iter_000004"]
    assert [o.artifact_dir.name for o in wait_for_publications(run, timeout=60) if o.ok] == ["iter_000002",
                                                                                             "iter_000004"]
    assert publish_pending(run, upload) == []  # receipted now: nothing to catch up
    assert not (store / RUN / "checkpoint_artifacts" / "iter_000006").exists()


def test_the_first_save_of_a_run_catches_up_its_unpublished_artifacts_before_its_own(tmp_path):
    run, store = tmp_path / "runs" / RUN, tmp_path / "store"
    store.mkdir()
    upload = UploadSettings(enabled=True, bucket=f"file://{store}")
    model, _ = tiny_training()
    write_artifact(run, 2, {"model": model})
    save_and_publish(run, 4, {"model": model}, upload)
    outcomes = wait_for_publications(run, timeout=60)
    assert [(o.artifact_dir.name, o.ok) for o in outcomes] == [("iter_000002", True), ("iter_000004", True)]
    assert publish_pending(run, UploadSettings(enabled=False)) == []


def test_a_process_acting_alone_raises_its_own_error_and_decides_for_itself():
    alone = Ranks.current()
    assert (alone.rank, alone.size, alone.collective, alone.is_main) == (0, 1, False, True)
    assert alone.decide("a decision", lambda: 7) == 7 and alone.broadcast("x") == "x"
    assert alone.settle("a save", None, {"a": 1}) == [{"a": 1}]
    error = Refused("the very error")
    with pytest.raises(Refused) as raised:
        alone.settle("a save", error)
    assert raised.value is error
