"""materialize from the archive onto a small disk: the fetch keeps room for the staged export.

The stage (``<out>.stage`` by default) and the staged export share a file system here, so a fetch that
fits alone but leaves too little for the export is refused before its first byte, naming both.
Real tmpfs mounts (``helpers.disks``: skipped with the reason where mounting is impossible, failed
when ``CI`` is set).
"""

from __future__ import annotations

import os

import pytest
from materialize_helpers import DEFAULTS, copy_tree

from ckptflow.archive.publish import publish_artifact
from ckptflow.conversion.source import read_base
from ckptflow.errors import InsufficientSpace, OutOfSpace, Refused
from ckptflow.materialize import materialize
from ckptflow.materialize.preflight import export_bytes
from ckptflow.store import LocalStore
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX
from helpers.disks import fill, tmpfs_mounts
from helpers.paused import resume, start_paused


@pytest.fixture
def small_disk(tmp_path):
    with tmpfs_mounts(tmp_path) as mount:
        yield mount


def file_archive(models, tmp_path):
    art = copy_tree(models.artifact("qwen3", 1), tmp_path / "local" / "checkpoint_artifacts" / "iter_000300")
    (tmp_path / "archive").mkdir()
    publish_artifact(art, LocalStore(tmp_path / "archive"), UPLOAD_PREFIX, progress=False)
    return art, f"file://{tmp_path / 'archive' / ARTIFACT_PREFIX}"


def test_a_fetch_that_leaves_no_room_for_the_export_is_refused_before_its_first_byte(models, tmp_path, small_disk):
    art, uri = file_archive(models, tmp_path)
    export = export_bytes(read_base(models.base()))
    model = (art / "model.pt").stat().st_size
    disk = small_disk(export + model // 2)  # the export fits, and so does the fetch alone; not both

    out = disk / "teacher"
    with pytest.raises(InsufficientSpace) as caught:
        materialize(artifact_uri=uri, base=models.base(), out=out, **DEFAULTS)
    message = str(caught.value)
    assert f"{export} bytes" in message and "must stay free for the staged export" in message, message
    assert caught.value.needed >= export + model > caught.value.free
    assert sorted(os.listdir(disk)) in ([], ["teacher.lock"])  # no stage, no output, no temporaries

    bigger = small_disk(export + 2 * model + (1 << 20))
    result = materialize(artifact_uri=uri, base=models.base(), out=bigger / "teacher", **DEFAULTS)
    assert result.status == "built"


def test_a_disk_filled_during_the_fetch_names_the_file_and_says_the_private_stage_is_removed(
        models, tmp_path, small_disk, monkeypatch):
    _, uri = file_archive(models, tmp_path)
    disk = small_disk(8 << 20)
    flag = tmp_path / "paused"
    worker, outcome = start_paused(
        lambda: materialize(artifact_uri=uri, base=models.base(), out=disk / "teacher", **DEFAULTS),
        "fetch:after-record", flag, monkeypatch)
    filler = fill(disk, leave=64 * 1024)  # less than model.pt
    resume(worker, flag, monkeypatch)

    err = outcome.get("error")
    assert isinstance(err, OutOfSpace) and not isinstance(err, Refused), outcome
    assert err.path.endswith("/iter_000300/model.pt") and err.path in str(err)
    assert "materialize then removes its private stage" in str(err) and "--keep-staged" in str(err)
    assert sorted(os.listdir(disk)) in (["other-writer.bin"], ["other-writer.bin", "teacher.lock"])

    filler.unlink()
    assert materialize(artifact_uri=uri, base=models.base(), out=disk / "teacher", **DEFAULTS).status == "built"
