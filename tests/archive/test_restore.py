"""`ckptflow restore`: a pruned (or damaged) artifact refilled in place from the archive its receipt names,
against a real SeaweedFS and a file:// archive, through real `ckptflow` processes."""

from __future__ import annotations

import json
import shutil
import signal
import uuid

import pytest

from ckptflow.archive.probe import run_probe
from ckptflow.archive.publish import publish_artifact
from ckptflow.archive.restore import restore_artifact
from ckptflow.errors import ConflictError
from ckptflow.jsonio import validate
from ckptflow.records import manifest as manifest_record
from ckptflow.records import receipt as receipt_record
from ckptflow.store.base import DEFAULT_CONCURRENCY
from ckptflow.store.credentials import load_credentials
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from ckptflow.store.transfer import DEFAULT_RANGE_SIZE
from helpers import servers
from helpers.artifacts import UPLOAD_PREFIX, make_artifact
from helpers.cli import run_cli, take_turns_at_a_lock
from helpers.paused import resume, start_paused
from helpers.trees import file_bytes, tree_bytes

PAYLOADS = ["model.pt", "optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp", "optim/__2_0.distcp"]
RECORDS = [manifest_record.FILENAME, ".posttrain-part-digests.json", receipt_record.FILENAME]
# More ranges than a download holds in flight (2 x concurrency): a kill after model.pt's first range
# always leaves the file short of its end.
BIG_MODEL = (2 * DEFAULT_CONCURRENCY + 1) * DEFAULT_RANGE_SIZE


@pytest.fixture(params=["seaweedfs", "file"])
def archive(request, tmp_path):
    """(store, extra CLI arguments) of a real archive the artifact is published to, qualified by a probe
    (prune-verified requires one)."""
    if request.param == "seaweedfs":
        store = request.getfixturevalue("sw_store")
        args = ["--credentials", str(request.getfixturevalue("seaweedfs_credentials_path"))]
    else:
        (tmp_path / "archive").mkdir()
        store, args = LocalStore(tmp_path / "archive"), []
    assert run_probe(store, "scratch").record.passed
    return store, args


def published(root, store, **kw):
    art = make_artifact(root, **kw)
    (art / "optim.pt").unlink()  # not selected by the manifest: prune would keep the artifact for it
    publish_artifact(art, store, UPLOAD_PREFIX, progress=False)
    return art


def prune(art, args):
    proc = run_cli("prune-verified", "--paths", str(art), *args)
    assert proc.returncode == 0, proc.stderr
    return proc.report


def restore(art, args, *extra, env=None):
    return run_cli("restore", "--artifact-dir", str(art), *args, *extra, env=env)


def status_row(art):
    proc = run_cli("status", str(art.parents[1]), "--json")
    assert proc.returncode == 0, proc.stderr
    [row] = proc.report["rows"]
    return row


@pytest.mark.slow
def test_restore_refills_a_pruned_artifact_in_place_and_prune_frees_it_again(archive, tmp_path):
    store, args = archive
    art = published(tmp_path / "run1", store)
    original = file_bytes(art)
    assert prune(art, args)["removed"][0]["files"] == PAYLOADS
    assert status_row(art)["pruned"]["state"] == "pruned"

    proc = restore(art, args)
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_restore", what="restore report")
    assert proc.report["status"] == "restored"
    assert proc.report["downloaded"] == PAYLOADS == proc.report["missing"]
    assert proc.report["downloaded_bytes"] == proc.report["total_bytes"] == sum(len(original[p]) for p in PAYLOADS)
    assert file_bytes(art) == original  # payloads byte-identical; manifest and receipt never rewritten
    assert not list(art.parent.glob("*.lock")) and not [p for p in tree_bytes(art) if p.endswith(".part")]
    receipt_record.read_receipt(art)  # still valid
    assert status_row(art)["pruned"]["state"] != "pruned" and status_row(art)["local_bytes"] == proc.report["total_bytes"]

    again = restore(art, args)
    assert again.returncode == 0, again.stderr
    assert again.report["status"] == "already-local" and again.report["downloaded_bytes"] == 0
    assert again.report["reused"] == PAYLOADS
    assert file_bytes(art) == original

    assert prune(art, args)["removed"][0]["files"] == PAYLOADS  # a later prune frees it again
    assert sorted(file_bytes(art)) == RECORDS


@pytest.mark.slow
def test_restore_killed_mid_file_resumes_sending_only_what_is_missing(archive, tmp_path):
    store, args = archive
    art = published(tmp_path / "run1", store, model_bytes=BIG_MODEL)
    original = file_bytes(art)
    prune(art, args)

    killed = restore(art, args, env={"CKPTFLOW_TEST_KILL_AT": "fetch:mid-file:model.pt"})
    assert killed.returncode == -signal.SIGKILL
    assert not (art / "model.pt").exists()
    assert len([p for p in tree_bytes(art) if p.startswith(".model.pt.") and p.endswith(".part")]) == 1
    assert {p: original[p] for p in RECORDS} == {p: (art / p).read_bytes() for p in RECORDS}
    assert status_row(art)["pruned"]["state"] in ("pruned", "partial")  # never shown as local

    rerun = restore(art, args)
    assert rerun.returncode == 0, rerun.stderr
    report = rerun.report
    validate(report, "report_restore", what="restore report")
    assert report["status"] == "restored"
    # Files committed before the kill are kept (re-hashed, not sent again); model.pt continues from its
    # re-verified prefix: what crossed the wire is exactly what was missing.
    assert sorted(report["reused"] + report["downloaded"]) == PAYLOADS
    resumed = {r["path"]: r["offset"] for r in report["resumed"]}
    assert DEFAULT_RANGE_SIZE <= resumed["model.pt"] < BIG_MODEL
    sent = sum(len(original[p]) - resumed.get(p, 0) for p in report["downloaded"])
    assert report["downloaded_bytes"] == sent < report["total_bytes"]
    assert file_bytes(art) == original
    assert not [p for p in tree_bytes(art) if p.endswith(".part")]


@pytest.mark.slow
def test_a_local_file_that_differs_is_refused_by_name_and_left_byte_identical(archive, tmp_path):
    store, args = archive
    art = published(tmp_path / "run1", store)
    prune(art, args)
    (art / "optim").mkdir()
    (art / "optim" / "__1_0.distcp").write_bytes(b"x" * 50_001)  # the declared size, other bytes
    before = tree_bytes(art.parent)

    for extra in ((), ("--dry-run",)):
        proc = restore(art, args, *extra)
        assert proc.returncode == 1 and proc.report["status"] == "refused", proc.stderr
        assert "optim/__1_0.distcp" in proc.stderr and "never overwrites" in proc.stderr
        assert tree_bytes(art.parent) == before  # nothing written, not even the other missing files


def test_a_file_appearing_during_the_download_is_never_overwritten(tmp_path, monkeypatch):
    (tmp_path / "archive").mkdir()
    store = LocalStore(tmp_path / "archive")
    art = published(tmp_path / "run1", store)
    for rel in PAYLOADS:
        (art / rel).unlink()
    flag = tmp_path / "paused"
    worker, outcome = start_paused(lambda: restore_artifact(art, lambda d: store, progress=False),
                                   "restore:before-download", flag, monkeypatch)
    (art / "model.pt").write_bytes(b"written by someone else meanwhile")
    resume(worker, flag, monkeypatch)
    assert isinstance(outcome.get("error"), ConflictError), outcome
    assert "model.pt" in str(outcome["error"])
    assert (art / "model.pt").read_bytes() == b"written by someone else meanwhile"
    assert not [p for p in tree_bytes(art) if p.endswith(".part")]


def test_an_artifact_that_lost_one_file_gets_only_that_file_back(archive, tmp_path):
    store, args = archive
    art = published(tmp_path / "run1", store)  # never pruned
    original = file_bytes(art)
    (art / "optim" / "__1_0.distcp").unlink()
    proc = restore(art, args)
    assert proc.returncode == 0, proc.stderr
    assert proc.report["downloaded"] == ["optim/__1_0.distcp"] == proc.report["missing"]
    assert proc.report["downloaded_bytes"] == len(original["optim/__1_0.distcp"])
    assert proc.report["reused"] == [p for p in PAYLOADS if p != "optim/__1_0.distcp"]
    assert file_bytes(art) == original


@pytest.mark.slow
def test_dry_run_reports_what_would_be_fetched_and_writes_nothing(archive, tmp_path):
    store, args = archive
    art = published(tmp_path / "run1", store)
    prune(art, args)
    before = tree_bytes(tmp_path, exclude=("cache",))
    proc = restore(art, args, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_restore", what="restore report")
    assert proc.report["status"] == "dry-run" and proc.report["dry_run"]
    assert proc.report["missing"] == PAYLOADS and proc.report["downloaded"] == []
    assert proc.report["missing_bytes"] == proc.report["total_bytes"] > 0
    assert tree_bytes(tmp_path, exclude=("cache",)) == before


def test_a_receipt_whose_archive_is_gone_is_a_clear_error(tmp_path):
    (tmp_path / "archive").mkdir()
    store = LocalStore(tmp_path / "archive")
    art = published(tmp_path / "run1", store)
    (art / "model.pt").unlink()
    shutil.rmtree(tmp_path / "archive")
    before = tree_bytes(art.parent)
    proc = restore(art, [])
    assert proc.returncode == 1, proc.stderr
    assert proc.report["error"]["type"] == "NotFound"
    line = proc.stderr.strip().splitlines()[-1]
    assert ".uploaded" in line and "deleted or moved" in line and str(tmp_path / "archive") in line
    assert tree_bytes(art.parent) == before


def test_restore_without_a_receipt_says_what_is_missing(tmp_path):
    art = make_artifact(tmp_path / "run1")
    proc = restore(art, [])
    assert proc.returncode == 1 and ".uploaded" in proc.stderr and "ckptflow fetch" in proc.stderr
    assert json.dumps(proc.report)  # one JSON error report


def test_two_restores_of_one_artifact_take_turns_and_the_second_finds_it_local(tmp_path):
    (tmp_path / "archive").mkdir()
    store = LocalStore(tmp_path / "archive")
    art = published(tmp_path / "run1", store)
    original = file_bytes(art)
    for rel in PAYLOADS:
        (art / rel).unlink()
    # The second waits for the artifact's restore lock, naming its holder, then finds the first one's files.
    first, out, err, second, out2, err2 = take_turns_at_a_lock(
        ("restore", "--artifact-dir", str(art)), "restore:before-download", "restore:lock-wait", tmp_path)
    assert first.returncode == 0, err
    assert second.returncode == 0, err2
    assert json.loads(out)["status"] == "restored"
    assert json.loads(out2)["status"] == "already-local" and json.loads(out2)["downloaded_bytes"] == 0
    assert file_bytes(art) == original
    assert not list(art.parent.glob("*.lock"))


def test_a_receipt_whose_bucket_was_deleted_is_a_clear_error(tmp_path, seaweedfs_credentials_path):
    bucket = f"ckptflow-t-{uuid.uuid4().hex[:16]}"  # its own bucket: this test deletes it
    servers.create_bucket(seaweedfs_credentials_path, bucket)
    try:
        art = published(tmp_path / "run1", S3Store(bucket, load_credentials(seaweedfs_credentials_path)))
    finally:
        servers.remove_bucket(seaweedfs_credentials_path, bucket)
    (art / "model.pt").unlink()
    before = tree_bytes(art.parent)
    proc = restore(art, ["--credentials", str(seaweedfs_credentials_path)])
    assert proc.returncode == 1 and proc.report["error"]["type"] == "NotFound", proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert ".uploaded" in line and "deleted or moved" in line and f"s3://{bucket}/" in line
    assert tree_bytes(art.parent) == before


# ------------------------------------------------------------------ crash windows of prune and restore


def hidden_leftovers(art):
    """Files under ``art`` that are neither a payload nor a record: temporaries, asides, parts."""
    return sorted(p for p in file_bytes(art) if p not in PAYLOADS and p not in RECORDS)


def killed_prune_with_model_set_aside(art, args):
    """A prune killed between renaming model.pt aside and unlinking it (its first file)."""
    killed = run_cli("prune-verified", "--paths", str(art), *args, env={"CKPTFLOW_TEST_KILL_AT": "release:after-aside"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (art / "model.pt").exists()
    [aside] = hidden_leftovers(art)
    assert aside.startswith(".model.pt.")
    return aside


@pytest.mark.slow
def test_a_prune_killed_with_a_payload_set_aside_is_counted_by_status_and_freed_by_the_rerun(archive, tmp_path):
    store, args = archive
    art = published(tmp_path / "run1", store)
    total = sum(len(b) for p, b in file_bytes(art).items() if p in PAYLOADS)
    killed_prune_with_model_set_aside(art, args)
    row = status_row(art)
    assert row["local_bytes"] == total  # every payload byte is still on disk, one file under another name
    assert row["pruned"]["state"] == "partial" and "prune-verified" in row["pruned"]["detail"]

    report = prune(art, args)
    assert report["freed_bytes"] == total and report["kept"] == []
    assert sorted(file_bytes(art)) == RECORDS and hidden_leftovers(art) == []
    row = status_row(art)
    assert row["pruned"]["state"] == "pruned" and row["local_bytes"] == 0


@pytest.mark.slow
def test_a_restore_puts_back_what_a_killed_prune_set_aside_and_a_later_prune_frees_it(archive, tmp_path):
    store, args = archive
    art = published(tmp_path / "run1", store)
    original = file_bytes(art)
    killed_prune_with_model_set_aside(art, args)
    before = tree_bytes(art.parent)
    dry = restore(art, args, "--dry-run")  # says what the real run does: nothing to download
    assert dry.returncode == 0 and dry.report["missing"] == [] and dry.report["reused"] == PAYLOADS, dry.stderr
    assert tree_bytes(art.parent) == before

    proc = restore(art, args)
    assert proc.returncode == 0, proc.stderr
    assert proc.report["downloaded_bytes"] == 0 and "model.pt" not in proc.report["downloaded"]
    assert file_bytes(art) == original and hidden_leftovers(art) == []  # the payload once, at its own name
    assert prune(art, args)["freed_bytes"] == sum(len(original[p]) for p in PAYLOADS)


@pytest.mark.slow
def test_a_restore_killed_between_linking_a_part_and_removing_it_leaves_nothing_that_blocks_pruning(archive, tmp_path):
    store, args = archive
    art = published(tmp_path / "run1", store)
    original = file_bytes(art)
    prune(art, args)
    killed = restore(art, args, env={"CKPTFLOW_TEST_KILL_AT": "restore:after-link"})
    assert killed.returncode == -signal.SIGKILL
    parts = hidden_leftovers(art)  # the linked one, and those of files still downloading when it was killed
    assert parts and all(p.endswith(".part") for p in parts)

    # A leftover part is named, with its remedy, by prune (never "not covered by the receipt").
    proc = run_cli("prune-verified", "--paths", str(art), *args)
    assert proc.report["freed_bytes"] == 0
    [kept] = proc.report["kept"]
    assert parts[0] in kept["reason"] and "ckptflow restore" in kept["reason"], kept
    assert "not covered" not in kept["reason"]

    for _ in range(2):  # the rerun completes the restore; a restore of a local artifact clears such parts too
        rerun = restore(art, args)
        assert rerun.returncode == 0, rerun.stderr
        assert file_bytes(art) == original and hidden_leftovers(art) == []
    assert prune(art, args)["freed_bytes"] == sum(len(original[p]) for p in PAYLOADS)  # it frees it again
    assert sorted(file_bytes(art)) == RECORDS


@pytest.mark.slow
def test_a_restore_lock_left_by_a_killed_holder_is_removed_by_the_next_restore_that_finds_the_artifact_local(
        archive, tmp_path):
    store, args = archive
    art = published(tmp_path / "run1", store)
    original = file_bytes(art)
    prune(art, args)
    lock = art.with_name(art.name + ".restore.lock")
    killed = restore(art, args, env={"CKPTFLOW_TEST_KILL_AT": "restore:lock-release"})
    assert killed.returncode == -signal.SIGKILL
    assert file_bytes(art) == original and json.loads(lock.read_text())["pid"]  # its holder's record stays

    again = restore(art, args)
    assert again.returncode == 0 and again.report["status"] == "already-local", again.stderr
    assert not lock.exists() and not list(art.parent.glob(f".{lock.name}*"))


# ------------------------------------------------------------------ a receipt that lists several destinations


def two_copies(tmp_path, b_store=None):
    """An artifact published to a ``file://`` root A, then to B (another ``file://`` root unless ``b_store``) with
    ``--add-destination``, and its payloads freed on A's proof alone (``prune-verified --destination A``). The
    receipt names B first (the current destination), then A."""
    a_root = tmp_path / "A"
    a_root.mkdir()
    a = LocalStore(a_root)
    if b_store is None:
        (tmp_path / "B").mkdir()
        b_store = LocalStore(tmp_path / "B")
    art = published(tmp_path / "run1", a)
    publish_artifact(art, b_store, UPLOAD_PREFIX, progress=False, add_destination=True)
    original = file_bytes(art)
    receipt = receipt_record.read_receipt(art)
    assert receipt.destination == receipt_record.ReceiptDestination.at(b_store.destination, receipt.destination.prefix)
    assert [d.endpoint for d in receipt.earlier_destinations] == [str(a_root)]
    assert run_probe(a, "scratch").record.passed
    pruned = run_cli("prune-verified", "--paths", str(art), "--destination", f"file://{a_root}")
    assert pruned.returncode == 0 and pruned.report["removed"][0]["files"] == PAYLOADS, pruned.stderr
    return art, original, a_root


def served_by_a(proc, art, original, a_root, b_where: str, why: str):
    """The restore succeeded from A after B was tried and skipped, naming B and why, in the report, the human
    summary and one warning."""
    from ckptflow.commands import summary

    assert proc.returncode == 0, proc.stderr[-3000:]
    validate(proc.report, "report_restore", what="restore report")
    assert proc.report["status"] == "restored" and file_bytes(art) == original
    assert proc.report["destination"]["endpoint"] == str(a_root)
    assert proc.report["source_uri"].startswith(f"file://{a_root}/")
    [skipped] = proc.report["skipped_destinations"]
    assert b_where in json.dumps(skipped["destination"]) and why in skipped["detail"], skipped
    assert proc.report["downloaded"] == PAYLOADS == proc.report["missing"]
    warned = [line for line in proc.stderr.splitlines() if "trying the next destination" in line]
    assert len(warned) == 1 and b_where in warned[0], proc.stderr[-3000:]
    text = summary.render("restore", proc.report, 1.0)
    assert f"from        file://{a_root}/" in text or f"file://{a_root}/" in text.split("skipped")[0]
    assert "skipped" in text and b_where in text


@pytest.mark.parametrize("fault", ["unmounted", "damaged"])
def test_a_restore_is_served_by_another_destination_when_the_receipts_current_one_cannot(tmp_path, fault):
    """Copies on A and B, payloads freed on A's proof: B's root gone (an unmounted file system) or B's model.pt
    damaged (same size: found by the download's check, after B put the other files in place) costs B only;
    the restore is served by A, and says so. ``--destination`` picks one copy: B alone fails naming it, A alone
    serves without trying B."""
    art, original, a_root = two_copies(tmp_path)
    b_root = tmp_path / "B"
    if fault == "unmounted":
        b_root.rename(tmp_path / "B.unmounted")
        why = "declaration"
    else:
        obj = next(b_root.rglob("model.pt"))
        data = bytearray(obj.read_bytes())
        data[1234] ^= 0x01
        obj.write_bytes(bytes(data))
        why = "model.pt"

    served_by_a(restore(art, []), art, original, a_root, str(b_root), why)

    assert run_cli("prune-verified", "--paths", str(art), "--destination", f"file://{a_root}").returncode == 0
    only_b = restore(art, [], "--destination", f"file://{b_root}")
    assert only_b.returncode == 1 and str(b_root) in only_b.stderr and why in only_b.stderr, only_b.stderr[-2000:]
    assert not (art / "model.pt").exists()
    only_a = restore(art, [], "--destination", f"file://{a_root}")
    assert only_a.returncode == 0 and only_a.report["skipped_destinations"] == [], only_a.stderr[-2000:]
    assert only_a.report["destination"]["endpoint"] == str(a_root) and "trying the next" not in only_a.stderr
    assert file_bytes(art) == original


@pytest.mark.seaweedfs
def test_a_restore_is_served_by_a_file_archive_when_the_s3_copys_credentials_are_missing(
        tmp_path, seaweedfs_bucket, seaweedfs_credentials_path):
    """B on SeaweedFS, A a ``file://`` root: without B's credentials (the file named gone, or none at all) the
    restore is served by A, which needs none."""
    b_store = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path))
    art, original, a_root = two_copies(tmp_path, b_store)
    gone = tmp_path / "credentials-that-were-removed.json"
    served_by_a(restore(art, ["--credentials", str(gone)]), art, original, a_root, seaweedfs_bucket, str(gone))

    for rel in PAYLOADS:
        (art / rel).unlink()
    none = {"CKPTFLOW_CREDENTIALS": "", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
            "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": str(tmp_path / "none"),
            "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    served_by_a(restore(art, [], env=none), art, original, a_root, seaweedfs_bucket, "")


def test_a_restore_no_destination_can_serve_names_each_and_why(tmp_path):
    art, _, a_root = two_copies(tmp_path)
    (tmp_path / "B").rename(tmp_path / "B.unmounted")
    a_root.rename(tmp_path / "A.unmounted")
    before = tree_bytes(art.parent)
    proc = restore(art, [])
    assert proc.returncode == 1 and proc.report["error"]["type"] == "NotFound", proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "none of the 2 destinations" in line and str(tmp_path / "B") in line and str(a_root) in line
    assert tree_bytes(art.parent) == before
