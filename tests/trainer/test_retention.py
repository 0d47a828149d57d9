"""Full-checkpoint retention: latest and the last N kept, older ones deleted only once uploaded; it and
artifact pruning never touch each other's directories."""

from __future__ import annotations

import hashlib
import json

import pytest
from trainer_helpers import tiny_training

from ckptflow.archive.prune import prune_verified
from ckptflow.archive.publish import publish_artifact
from ckptflow.commands.summary import render
from ckptflow.errors import NotFound, UsageError
from ckptflow.fsutil import unique_temp_path
from ckptflow.jsonio import validate
from ckptflow.records import receipt as receipt_record
from ckptflow.records.inventory import FileEntry
from ckptflow.store.local import LocalStore
from ckptflow.store.open import store_factory
from ckptflow.trainer import artifact_dir_for, write_artifact
from ckptflow.trainer.retention import checkpoint_provenance, retain_checkpoints, write_checkpoint_receipt
from helpers.cli import run_cli
from helpers.trees import tree_bytes


def ckpt(run, it, *, uploaded=None, resumable=True):
    d = run / "checkpoints" / f"iter_{it:07d}"
    d.mkdir(parents=True)
    (d / "model.pt").write_bytes(b"m" * 100)
    if resumable:
        (d / "trainer.pt").write_bytes(b"t" * 10)
    if uploaded is not None:
        (d / ".uploaded").write_text(uploaded)
    return d


def names(paths):
    return sorted(p.rsplit("/", 1)[1] for p in paths)


def test_keeps_latest_and_last_n_and_deletes_only_uploaded(tmp_path):
    run = tmp_path / "ts"
    for it in (1, 2, 3, 4, 5, 6):
        ckpt(run, it, uploaded="uploaded to s3://old-tool\n" if it != 3 else None)  # legacy text markers
    ckpt(run, 0, uploaded="x", resumable=False)  # an incomplete save: left alone
    (run / "checkpoints" / "latest").symlink_to("iter_0000002")
    dry = retain_checkpoints(run, 2, dry_run=True)
    assert names(dry.removed) == ["iter_0000001", "iter_0000004"] and all(
        (run / "checkpoints" / n).is_dir() for n in names(dry.removed))
    report = retain_checkpoints(run, 2)
    assert names(report.removed) == ["iter_0000001", "iter_0000004"]
    assert report.freed_bytes == 2 * (100 + 10 + len("uploaded to s3://old-tool\n"))
    reasons = {k["path"].rsplit("/", 1)[1]: k["reason"] for k in report.kept}
    assert reasons == {"iter_0000002": "latest", "iter_0000003": "not uploaded (no .uploaded)",
                       "iter_0000005": "one of the last 2", "iter_0000006": "one of the last 2"}
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "iter_0000000", "iter_0000002", "iter_0000003", "iter_0000005", "iter_0000006", "latest"]
    assert retain_checkpoints(run, 2).removed == []


def test_latest_as_a_text_file_and_keep_last_zero(tmp_path):
    run = tmp_path / "ts"
    for it in (1, 2):
        ckpt(run, it, uploaded="")
    (run / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1\n")
    assert names(retain_checkpoints(run, 0).removed) == ["iter_0000002"]
    with pytest.raises(UsageError):
        retain_checkpoints(run, -1)


def test_archive_bookkeeping_is_excluded_from_checkpoint_provenance(tmp_path):
    d = ckpt(tmp_path, 1)
    before = checkpoint_provenance(d)
    assert before == [("model.pt", 100), ("trainer.pt", 10)]
    (d / ".uploaded").write_text("{}")
    (d / ".uploaded.tmp").write_text("half")
    unique_temp_path(d / ".uploaded").write_text("receipt in flight")
    assert checkpoint_provenance(d) == before
    (d / "extra.bin").write_bytes(b"e")
    assert checkpoint_provenance(d) != before


def published_artifact(run, store_root):
    write_artifact(run, 10, {"model": tiny_training()[0]})
    art = artifact_dir_for(run, 10)
    publish_artifact(art, LocalStore(store_root), "p/g/r/ts/checkpoints", progress=False)
    return art


def test_retention_never_touches_checkpoint_artifacts(tmp_path):
    run = tmp_path / "ts"
    (tmp_path / "store").mkdir()
    art = published_artifact(run, tmp_path / "store")
    for it in (1, 2, 3):
        ckpt(run, it, uploaded="")
    before = tree_bytes(run / "checkpoint_artifacts")
    assert names(retain_checkpoints(run, 0).removed) == ["iter_0000001", "iter_0000002", "iter_0000003"]
    assert tree_bytes(run / "checkpoint_artifacts") == before and (art / "model.pt").exists()


def test_artifact_pruning_never_touches_checkpoints(tmp_path):
    run = tmp_path / "ts"
    (tmp_path / "store").mkdir()
    art = published_artifact(run, tmp_path / "store")
    old = ckpt(run, 1, uploaded="legacy text marker")
    before = tree_bytes(run / "checkpoints")
    report = prune_verified([art], store_factory(None), read_data=True)
    assert not (art / "model.pt").exists() and report.removed  # the artifact's payload went
    assert tree_bytes(run / "checkpoints") == before
    # Named explicitly, a checkpoint with a (legacy) marker is still not released by the artifact gate.
    report = prune_verified([old], store_factory(None), read_data=True)
    assert not report.removed and tree_bytes(run / "checkpoints") == before


def test_command_report_and_summary(tmp_path):
    run = tmp_path / "ts"
    for it in (1, 2, 3):
        ckpt(run, it, uploaded="")
    proc = run_cli("retain-checkpoints", "--run-dir", str(run), "--keep-last", "1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_retain_checkpoints", what="retain-checkpoints report")
    assert proc.report["status"] == "dry-run" and len(proc.report["removed"]) == 2
    assert "would remove 2 checkpoints" in render("retain-checkpoints", proc.report, 0.1)
    proc = run_cli("retain-checkpoints", "--run-dir", str(run), "--keep-last", "1")
    assert proc.returncode == 0 and proc.report["status"] == "retained"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_0000003"]
    assert run_cli("retain-checkpoints", "--run-dir", str(tmp_path / "none"), "--keep-last", "1").returncode == 1


# ------------------------------------------------------------------ full-checkpoint receipts

DEST = receipt_record.ReceiptDestination("s3", "127.0.0.1:18333", "ckpts", "p/g/r/ts/checkpoints/iter_0000001")


def full_ckpt(run, it, *, pointer=True):
    d = ckpt(run, it)
    (d / "model").mkdir()
    (d / "model" / "__0_0.distcp").write_bytes(b"s" * 300)
    if pointer:
        (d / "latest_checkpointed_iteration.txt").write_text(f"{it}\n")  # rewritten in place by each save
    return d


def test_write_checkpoint_receipt_records_bulk_files_by_size_and_overrides_by_digest(tmp_path):
    d = full_ckpt(tmp_path, 1)
    before = checkpoint_provenance(d)
    record = write_checkpoint_receipt(d, DEST, uploaded_at="2026-12-01T00:00:00Z")
    assert checkpoint_provenance(d) == before  # the receipt is bookkeeping, not provenance
    on_disk = json.loads((d / ".uploaded").read_bytes())
    assert on_disk["kind"] == "full-checkpoint" and on_disk["destination"]["prefix"] == DEST.prefix
    assert on_disk["files"] == [{"path": "model.pt", "size": 100}, {"path": "model/__0_0.distcp", "size": 300},
                                {"path": "trainer.pt", "size": 10}]
    assert on_disk["overrides"] == [{"path": "latest_checkpointed_iteration.txt", "size": 2,
                                     "sha256": hashlib.sha256(b"1\n").hexdigest()}]
    assert receipt_record.read_any_receipt(d) == record
    with pytest.raises(receipt_record.NotAnArtifactReceipt):
        receipt_record.read_receipt(d)
    explicit = write_checkpoint_receipt(d, DEST, overrides=["trainer.pt"])
    assert [e.path for e in explicit.overrides] == ["trainer.pt"] and explicit.overrides[0].sha256
    assert all(e.sha256 is None for e in explicit.files)
    with pytest.raises(NotFound, match=r"\['missing.txt'\]"):
        write_checkpoint_receipt(d, DEST, overrides=["missing.txt"])
    with pytest.raises(NotFound):
        write_checkpoint_receipt(tmp_path / "nowhere", DEST)


def _artifact_receipt(d):
    files = tuple(FileEntry(p, s, hashlib.sha256((d / p).read_bytes()).hexdigest())
                  for p, s in checkpoint_provenance(d))
    receipt_record.write_receipt(d, receipt_record.Receipt(DEST, "a" * 64, files, "2026-12-01T00:00:00Z"))


def _rewrite(path, data):
    path.write_bytes(data)


CASES = {  # what happened after the upload -> the kept reason (None: deleted)
    "full_checkpoint_receipt": (lambda d: write_checkpoint_receipt(d, DEST), None),
    "artifact_receipt": (_artifact_receipt, None),
    "legacy_marker": (lambda d: (d / ".uploaded").write_text("uploaded by the old tool\n"), None),
    "empty_legacy_marker": (lambda d: (d / ".uploaded").write_bytes(b""), None),
    "file_added_after_upload": (lambda d: (write_checkpoint_receipt(d, DEST), (d / "extra.bin").write_bytes(b"e")),
                                "files not covered by its .uploaded: ['extra.bin']"),
    "bulk_file_resized": (lambda d: (write_checkpoint_receipt(d, DEST), _rewrite(d / "model.pt", b"m" * 99)),
                          "model.pt has 99 bytes, .uploaded says 100"),
    "bulk_file_gone": (lambda d: (write_checkpoint_receipt(d, DEST), (d / "model" / "__0_0.distcp").unlink()),
                       "model/__0_0.distcp is missing"),
    "override_rewritten_same_size": (lambda d: (write_checkpoint_receipt(d, DEST),
                                                _rewrite(d / "latest_checkpointed_iteration.txt", b"9\n")),
                                     "latest_checkpointed_iteration.txt bytes differ from .uploaded"),
    "corrupt_json": (lambda d: (d / ".uploaded").write_text('{"protocol": '), "not a valid receipt"),
    "invalid_receipt": (lambda d: (d / ".uploaded").write_text('{"protocol": "posttrain.archive-marker.v1", '
                                                               '"kind": "full-checkpoint"}'),
                        "not a valid receipt"),
    "receipt_is_a_symlink": (lambda d: (write_checkpoint_receipt(d, DEST), (d / ".uploaded").rename(d / "r"),
                                        (d / ".uploaded").symlink_to("r")), "symlink"),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_retention_accepts_both_receipt_kinds_and_the_legacy_marker_while_they_describe_the_checkpoint(
        tmp_path, case):
    run = tmp_path / "ts"
    old = full_ckpt(run, 1)
    newest = full_ckpt(run, 2)
    damage, reason = CASES[case]
    damage(old)
    before = tree_bytes(old)
    dry = retain_checkpoints(run, 1, dry_run=True)
    assert tree_bytes(old) == before
    report = retain_checkpoints(run, 1)
    assert dry.removed == report.removed
    kept = {k["path"]: k["reason"] for k in report.kept}
    if reason is None:
        assert report.removed == [str(old)] and not old.exists()
    else:
        assert report.removed == [] and reason in kept[str(old)] and tree_bytes(old) == before
    assert kept[str(newest)] == "one of the last 1"
