"""What a receipt, a pointer and a save in progress prove to ``retain-checkpoints``, through the real CLI:
a receipt proves only the bytes that existed when it was written; ``latest`` is resolved by iteration and an
unresolvable pointer deletes nothing; a save in progress is neither counted nor deleted."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from ckptflow.errors import Refused
from ckptflow.records import receipt as receipt_record
from ckptflow.trainer.retention import write_checkpoint_receipt
from helpers.cli import run_cli
from helpers.trees import tree_bytes


def save(run, it, fill=b"a"):
    """A full checkpoint as a trainer writes it: trainer state first, then the shards."""
    d = run / "checkpoints" / f"iter_{it:07d}"
    (d / "model").mkdir(parents=True, exist_ok=True)
    (d / "trainer.pt").write_bytes(fill * 10)
    (d / "model" / "__0_0.distcp").write_bytes(fill * 300)
    return d


def upload(d, archive):
    """Copy the checkpoint to a file:// archive (the trainer's own tooling), then write its receipt."""
    shutil.copytree(d, archive / d.name)
    return write_checkpoint_receipt(d, receipt_record.ReceiptDestination("file", str(archive), "", d.name))


def retain(run, keep_last, *extra):
    proc = run_cli("retain-checkpoints", "--run-dir", str(run), "--keep-last", str(keep_last), *extra)
    return proc, {k["path"].rsplit("/", 1)[1]: k["reason"] for k in (proc.report or {}).get("kept", [])}


def resave_in_place(path, data):
    with open(path, "r+b") as fh:  # the same inode, the same size, new bytes
        fh.write(data)


def resave_by_rename_keeping_mtime(path, data):
    st = path.stat()
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # even the old mtime: the inode and ctime differ


@pytest.mark.parametrize("resave", [resave_in_place, resave_by_rename_keeping_mtime])
def test_a_checkpoint_resaved_after_its_upload_is_kept_after_a_rollback(tmp_path, resave):
    run, archive = tmp_path / "run" / "ts", tmp_path / "archive"
    archive.mkdir()
    untouched = save(run, 100)
    for it in (100, 200, 300):
        upload(save(run, it), archive)
    # A loss spike: training rolls back and re-saves 200 and 300 in place with new bytes of the same sizes.
    for it in (200, 300):
        d = run / "checkpoints" / f"iter_{it:07d}"
        resave(d / "model" / "__0_0.distcp", b"b" * 300)
    save(run, 400)
    save(run, 500)
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("500\n")
    before = {it: tree_bytes(run / "checkpoints" / f"iter_{it:07d}") for it in (200, 300)}
    proc, kept = retain(run, 2)
    assert proc.returncode == 0, proc.stderr
    assert proc.report["removed"] == [str(untouched)]  # the receipt still proves the untouched one
    for it in (200, 300):
        assert "model/__0_0.distcp was replaced or rewritten since its upload" in kept[f"iter_{it:07d}"]
        assert tree_bytes(run / "checkpoints" / f"iter_{it:07d}") == before[it]


def test_a_receipt_without_identities_proves_nothing_newer_than_itself(tmp_path):
    run, archive = tmp_path / "run" / "ts", tmp_path / "archive"
    archive.mkdir()
    d = save(run, 100)
    record = upload(d, archive)
    older = receipt_record.CheckpointReceipt(record.destination, record.files, record.overrides, record.uploaded_at)
    receipt_record.write_receipt(d, older)  # as written before identities were recorded
    assert "identities" not in json.loads((d / ".uploaded").read_bytes())
    save(run, 200)
    resave_in_place(d / "trainer.pt", b"b" * 10)
    before = tree_bytes(d)
    proc, kept = retain(run, 1)
    assert proc.returncode == 0 and proc.report["removed"] == []
    assert "['trainer.pt'] changed after its .uploaded was written" in kept["iter_0000100"]
    assert "proves nothing newer than itself" in kept["iter_0000100"] and tree_bytes(d) == before


def test_the_receipt_is_written_past_the_coarse_window_of_what_it_records(tmp_path):
    from ckptflow.trainer.retention import coarse_window

    d = save(tmp_path / "run", 100)
    record = write_checkpoint_receipt(d, receipt_record.ReceiptDestination("file", "/a", "", "p"))
    receipt_ctime = (d / ".uploaded").lstat().st_ctime_ns
    ctimes = [i.ctime_ns for i in record.identities.values()]
    assert receipt_ctime - max(ctimes) >= coarse_window([*ctimes, receipt_ctime])
    assert sorted(record.identities) == ["model/__0_0.distcp", "trainer.pt"]
    assert sorted(p.name for p in d.iterdir()) == [".uploaded", "model", "trainer.pt"]  # the clock probe is gone
    assert coarse_window([3_000_000_000, 5_000_000_000]) == 2_000_000_000  # a 1-second file system
    assert coarse_window([3_000_000_123, 5_000_000_000]) == 20_000_000


def test_a_file_changed_during_the_upload_refuses_the_receipt(tmp_path):
    from ckptflow.trainer.retention import observe_checkpoint

    d = save(tmp_path / "run", 100)
    observed = observe_checkpoint(d)
    resave_in_place(d / "trainer.pt", b"b" * 10)
    with pytest.raises(Refused, match=r"\['trainer.pt'\] changed or appeared"):
        write_checkpoint_receipt(d, receipt_record.ReceiptDestination("file", "/a", "", "p"), observed=observed)
    assert not (d / ".uploaded").exists()


POINTERS = {  # how latest_checkpointed_iteration.txt (or the latest symlink) names iteration 100
    "unpadded": ("file", "iter_100\n"),
    "number": ("file", "100\n"),
    "trailing_slash": ("file", "iter_000100/\n"),
    "absolute_path": ("file", "{checkpoints}/iter_0000100\n"),
    "symlink_relative_slash": ("link", "iter_0000100/"),
    "symlink_absolute": ("link", "{checkpoints}/iter_0000100"),
}


def uploaded_run(tmp_path):
    run, archive = tmp_path / "run" / "ts", tmp_path / "archive"
    archive.mkdir()
    for it in (50, 100, 200):
        upload(save(run, it), archive)
    return run, run / "checkpoints"


def point(checkpoints, kind, text):
    text = text.format(checkpoints=checkpoints)
    if kind == "link":
        (checkpoints / "latest").symlink_to(text)
    else:
        (checkpoints / "latest_checkpointed_iteration.txt").write_text(text)


@pytest.mark.parametrize("form", POINTERS, ids=list(POINTERS))
def test_latest_is_resolved_by_iteration_number(tmp_path, form):
    run, checkpoints = uploaded_run(tmp_path)
    point(checkpoints, *POINTERS[form])
    proc, kept = retain(run, 1)
    assert proc.returncode == 0, proc.stderr
    assert kept == {"iter_0000100": "latest", "iter_0000200": "one of the last 1"}
    assert [p.rsplit("/", 1)[1] for p in proc.report["removed"]] == ["iter_0000050"]


UNRESOLVED = {
    "no_such_iteration": ("file", "iter_999\n"),
    "another_runs_checkpoint": ("file", "{other}/checkpoints/iter_0000100\n"),
    "not_an_iteration": ("file", "release\n"),
    "empty": ("file", ""),
    "dangling_symlink": ("link", "iter_0000999"),
    "symlink_out_of_the_run": ("link", "{other}/checkpoints/iter_0000100"),
}


@pytest.mark.parametrize("form", UNRESOLVED, ids=list(UNRESOLVED))
def test_a_pointer_that_names_no_checkpoint_of_this_run_deletes_nothing(tmp_path, form):
    run, checkpoints = uploaded_run(tmp_path)
    other = tmp_path / "other"
    (other / "checkpoints" / "iter_0000100").mkdir(parents=True)
    kind, text = UNRESOLVED[form]
    point(checkpoints, kind, text.replace("{other}", str(other)))
    before = tree_bytes(checkpoints)
    for extra in ((), ("--dry-run",)):
        proc, _ = retain(run, 1, *extra)
        assert proc.returncode == 1 and "names no checkpoint directory" in proc.stderr
        name = "latest" if kind == "link" else "latest_checkpointed_iteration.txt"
        assert f"{checkpoints / name} holds {text.replace('{other}', str(other)).strip()!r}" in proc.stderr
    assert tree_bytes(checkpoints) == before


def test_a_save_in_progress_is_not_counted_and_never_deleted(tmp_path):
    from ckptflow.trainer.checkpoints import begin_checkpoint_save, finish_checkpoint_save

    run, checkpoints = uploaded_run(tmp_path)
    d = checkpoints / "iter_0000300"
    begin_checkpoint_save(d)
    save(run, 300)  # trainer.pt written, shards still coming
    proc, kept = retain(run, 1)
    assert proc.returncode == 0, proc.stderr
    assert kept["iter_0000200"] == "one of the last 1" and "save in progress" in kept["iter_0000300"]
    assert sorted(p.rsplit("/", 1)[1] for p in proc.report["removed"]) == ["iter_0000050", "iter_0000100"]
    finish_checkpoint_save(d)
    proc, kept = retain(run, 1)
    assert kept == {"iter_0000300": "one of the last 1"}
    assert [p.rsplit("/", 1)[1] for p in proc.report["removed"]] == ["iter_0000200"]
