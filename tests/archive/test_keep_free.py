"""``prune-verified --runs-root R --keep-free SIZE|PCT``: free verified artifacts oldest first (iteration order
within a run, publication time across runs) until R's file system has the target free, never the newest of
a run, stopping as soon as the target is met; a dry run writes nothing.

R lies on a real small tmpfs (``helpers.disks``: root only; failed, never skipped, when ``CI`` is set); the
archive is a real SeaweedFS bucket or a ``file://`` directory; the command is the real CLI in a subprocess.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys

import pytest
from archive_helpers import remote_snapshot

from ckptflow.archive.keep_free import parse_target
from ckptflow.archive.probe import run_probe
from ckptflow.archive.publish import publish_artifact
from ckptflow.commands.prune_verified import summarize
from ckptflow.errors import UsageError
from ckptflow.jsonio import validate
from ckptflow.records import manifest as manifest_record
from ckptflow.records import receipt as receipt_record
from ckptflow.store.credentials import load_credentials
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from helpers.artifacts import make_artifact
from helpers.cli import run_cli, wait_for_file
from helpers.disks import tmpfs_mounts
from helpers.trees import tree_bytes

MiB = 1024 * 1024
TS = "20261129T000000Z"
# (run, iteration, publication time): run b's first artifact was published before run a's.
PUBLISHED = [("a", 100, "2026-11-29T01:00:00Z"), ("a", 200, "2026-11-29T03:00:00Z"), ("a", 300, "2026-11-29T05:00:00Z"),
             ("b", 100, "2026-11-29T00:00:00Z"), ("b", 200, "2026-11-29T02:00:00Z")]
MODEL_BYTES = 6 * MiB


def run_dir(runs, run):
    return runs / "proj" / "group" / run / TS


def art_of(runs, run, iteration):
    return run_dir(runs, run) / "checkpoint_artifacts" / f"iter_{iteration:06d}"


@pytest.fixture(params=["s3", "file"])
def archive(request, tmp_path):
    """(store, extra CLI arguments): a qualified SeaweedFS bucket, or a qualified ``file://`` directory."""
    if request.param == "s3":
        creds = request.getfixturevalue("seaweedfs_credentials_path")
        store = S3Store(request.getfixturevalue("seaweedfs_bucket"), load_credentials(creds))
        args = ("--credentials", str(creds))
    else:
        store = LocalStore(tmp_path / "archive")
        store.root.mkdir()
        args = ()
    assert run_probe(store, "scratch").record.passed
    return store, args


@pytest.fixture
def runs(tmp_path, archive):
    """A runs root on a fresh 64 MiB tmpfs with five published artifacts in two runs (see PUBLISHED)."""
    store, _ = archive
    with tmpfs_mounts(tmp_path / "disks") as mount:
        root = mount(64 * MiB) / "runs"
        for seed, (run, iteration, at) in enumerate(PUBLISHED):
            art = make_artifact(run_dir(root, run), iteration=iteration, model_bytes=MODEL_BYTES, seed=seed)
            (art / "optim.pt").unlink()  # not in the manifest: it would keep the artifact
            publish_artifact(art, store, f"proj/group/{run}/{TS}/checkpoints", progress=False)
            rec = receipt_record.read_receipt(art)  # the publication time the order is taken from
            receipt_record.write_receipt(art, receipt_record.Receipt(
                rec.destination, rec.declaration_sha256, rec.files, at, rec.server_checksums, rec.earlier_destinations))
        yield root


def payload_bytes(art) -> int:
    return sum(p.stat().st_size for p in art.rglob("*") if p.is_file() and not p.name.startswith("."))


def keep_free(runs, args, target, *more):
    """The real CLI freeing to ``target``: a size text (``100%``), or an int of bytes (passed as ``<n>B``)."""
    target = f"{target}B" if isinstance(target, int) else target
    proc = run_cli("prune-verified", "--runs-root", str(runs), "--keep-free", target, *args, *more)
    assert proc.report is not None, proc.stderr
    validate(proc.report, "report_prune_verified", what="prune-verified report")
    return proc


def kept_reasons(report) -> dict[str, str]:
    return {k["path"]: k["reason"] for k in report["kept"]}


@pytest.mark.slow
def test_frees_oldest_first_exactly_enough_and_keeps_the_newest_of_each_run(runs, archive):
    _, args = archive
    free = shutil.disk_usage(runs).free
    one = payload_bytes(art_of(runs, "b", 100))
    target = free + one + one // 2  # needs two artifacts, not three

    proc = keep_free(runs, args, target)

    assert proc.returncode == 0, proc.stderr
    report = proc.report
    first, second = art_of(runs, "b", 100), art_of(runs, "a", 100)  # published first, then a's oldest
    assert [r["path"] for r in report["removed"]] == [str(first), str(second)]
    assert payload_bytes(first) == payload_bytes(second) == 0
    after = shutil.disk_usage(runs).free
    kf = report["keep_free"]
    assert kf["met"] and kf["free_before"] == free and kf["free_after"] == after >= target
    assert after - report["removed"][-1]["bytes"] < target  # one artifact fewer would not have met it
    reasons = kept_reasons(report)
    assert set(reasons) == {str(art_of(runs, "a", 200)), str(art_of(runs, "a", 300)), str(art_of(runs, "b", 200))}
    assert "not needed" in reasons[str(art_of(runs, "a", 200))]
    for run, iteration in (("a", 300), ("b", 200)):
        assert "newest" in reasons[str(art_of(runs, run, iteration))]
        assert payload_bytes(art_of(runs, run, iteration)) > MODEL_BYTES

    again = keep_free(runs, args, target)  # met already: nothing more goes
    assert again.returncode == 0 and again.report["removed"] == [] and again.report["keep_free"]["met"]


@pytest.mark.slow
def test_an_unreachable_target_frees_all_but_the_newest_and_says_it_is_not_met(runs, archive):
    _, args = archive
    proc = keep_free(runs, args, "100%", "--keep-newest", "2")
    assert proc.returncode == 0, proc.stderr
    assert [r["path"] for r in proc.report["removed"]] == [str(art_of(runs, "a", 100))]
    assert not proc.report["keep_free"]["met"]
    assert all("newest 2" in reason for reason in kept_reasons(proc.report).values())


@pytest.mark.slow
def test_percent_target_is_taken_of_the_file_systems_size(runs, archive):
    _, args = archive
    usage = shutil.disk_usage(runs)
    one = payload_bytes(art_of(runs, "b", 100))
    percent = math.floor((usage.free + one + one // 2) * 100 / usage.total)  # between one and two artifacts
    assert usage.free + one < math.ceil(usage.total * percent / 100) <= usage.free + 2 * one

    proc = keep_free(runs, args, f"{percent}%")

    assert proc.returncode == 0, proc.stderr
    assert [r["path"] for r in proc.report["removed"]] == [str(art_of(runs, "b", 100)), str(art_of(runs, "a", 100))]
    assert proc.report["keep_free"]["target_bytes"] == math.ceil(usage.total * percent / 100)
    assert shutil.disk_usage(runs).free * 100 >= usage.total * percent


@pytest.mark.slow
def test_dry_run_writes_nothing_and_computes_what_the_real_run_frees(runs, archive, probe_cache):
    store, args = archive
    free = shutil.disk_usage(runs).free
    one = payload_bytes(art_of(runs, "b", 100))
    target = free + one + one // 2
    before = tree_bytes(runs), remote_snapshot(store, "proj"), tree_bytes(probe_cache)

    dry = keep_free(runs, args, target, "--dry-run")

    assert dry.returncode == 0, dry.stderr
    assert (tree_bytes(runs), remote_snapshot(store, "proj"), tree_bytes(probe_cache)) == before
    assert shutil.disk_usage(runs).free == free
    planned = [r["path"] for r in dry.report["removed"]]
    assert planned == [str(art_of(runs, "b", 100)), str(art_of(runs, "a", 100))]
    assert all(r["dry_run"] for r in dry.report["removed"])
    kf = dry.report["keep_free"]
    assert kf["computed"] and kf["met"] and kf["free_before"] == free and kf["free_after"] >= target

    real = keep_free(runs, args, target)
    assert [r["path"] for r in real.report["removed"]] == planned
    assert real.report["keep_free"]["free_after"] == kf["free_after"]  # the sizes, rounded to blocks


def statvfs_free(path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def link_payloads(art, elsewhere):
    """A second name for every payload of ``art`` under ``elsewhere`` (a Trainer's ``checkpoint-N`` an older
    export hard-linked): the bytes stay while that name does."""
    elsewhere.mkdir(parents=True)
    for rel in manifest_payload(art):
        (elsewhere / rel.replace("/", "__")).hardlink_to(art / rel)


def manifest_payload(art) -> dict[str, int]:
    """The payload files the manifest names (DCP's ``.metadata`` included), by path, with their sizes."""
    return {e.path: e.size for e in manifest_record.read_manifest(art).physical_files()}


@pytest.mark.slow
def test_keep_free_never_picks_an_artifact_whose_payloads_have_another_name_dry_run_and_real_run_alike(runs, archive):
    _, args = archive
    oldest = art_of(runs, "b", 100)
    ckpt = run_dir(runs, "b") / "checkpoint-100"
    link_payloads(oldest, ckpt)
    free = statvfs_free(runs)
    one = payload_bytes(art_of(runs, "a", 100))
    target = free + one + one // 2

    dry = keep_free(runs, args, target, "--dry-run")
    real = keep_free(runs, args, target)

    assert dry.returncode == real.returncode == 0, (dry.stderr, real.stderr)
    planned = [r["path"] for r in dry.report["removed"]]
    assert planned == [r["path"] for r in real.report["removed"]] == [str(art_of(runs, "a", 100)), str(art_of(runs, "a", 200))]
    for report in (dry.report, real.report):
        reason = kept_reasons(report)[str(oldest)]
        assert "frees nothing" in reason and str(ckpt / "model.pt") in reason, reason
        assert "held" not in str(report["removed"])
    assert payload_bytes(oldest) > MODEL_BYTES  # never unlinked: resuming from it needs no restore
    gained = statvfs_free(runs) - free
    assert gained == real.report["keep_free"]["free_after"] - free == dry.report["keep_free"]["free_after"] - free
    assert real.report["freed_bytes"] == dry.report["freed_bytes"] <= gained  # sizes; the disk frees whole pages


@pytest.mark.slow
def test_prune_paths_reports_hard_linked_payloads_as_held_and_frees_only_what_the_file_system_gets_back(runs, archive):
    _, args = archive
    linked, sole = art_of(runs, "b", 100), art_of(runs, "a", 100)
    ckpt = run_dir(runs, "b") / "checkpoint-100"
    link_payloads(linked, ckpt)
    held_bytes, sole_bytes = sum(manifest_payload(linked).values()), sum(manifest_payload(sole).values())
    free = statvfs_free(runs)

    dry = run_cli("prune-verified", "--paths", str(linked), str(sole), "--dry-run", *args)
    assert dry.returncode == 0, dry.stderr
    assert dry.report["freed_bytes"] == sole_bytes and statvfs_free(runs) == free
    proc = run_cli("prune-verified", "--paths", str(linked), str(sole), *args)

    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_prune_verified", what="prune-verified report")
    gained = statvfs_free(runs) - free
    removed = {r["path"]: r for r in proc.report["removed"]}
    assert removed[str(linked)]["bytes"] == 0 and removed[str(sole)]["bytes"] == sole_bytes
    assert proc.report["freed_bytes"] == sole_bytes and sole_bytes <= gained < sole_bytes + 64 * 4096
    held = {h["file"]: h for h in removed[str(linked)]["held"]}
    assert set(held) == set(removed[str(linked)]["files"]) and "model.pt" in held
    assert held["model.pt"]["links"] == 1 and held["model.pt"]["other_names"] == [str(ckpt / "model.pt")]
    assert not any((linked / rel).exists() for rel in manifest_payload(linked))
    assert sum(p.stat().st_size for p in ckpt.iterdir()) == held_bytes
    assert dry.report["removed"][0].get("held") == removed[str(linked)]["held"]
    shown = summarize(proc.report, None)
    assert f"held     {linked}: model.pt (also {ckpt / 'model.pt'})" in shown and "nothing freed" in shown, shown


@pytest.mark.slow
def test_publish_delete_local_reports_hard_linked_payloads_as_held_and_frees_only_what_the_file_system_gets_back(
        runs, archive):
    from ckptflow.commands.publish import summarize as summarize_publish

    store, _ = archive
    linked = art_of(runs, "b", 100)
    ckpt = run_dir(runs, "b") / "checkpoint-100"
    link_payloads(linked, ckpt)
    free = statvfs_free(runs)
    report = publish_artifact(linked, store, f"proj/group/b/{TS}/checkpoints", progress=False,
                              delete_local=True).to_report()
    validate(report, "report_publish", what="publish report")
    assert sorted(report["removed"]) == sorted(manifest_payload(linked))
    assert report["freed_bytes"] == 0 and statvfs_free(runs) - free < 64 * 4096
    held = {h["file"]: h for h in report["held"]}
    assert set(held) == set(report["removed"]) and held["model.pt"]["other_names"] == [str(ckpt / "model.pt")]
    shown = summarize_publish(report, None)
    assert f"model.pt (also {ckpt / 'model.pt'})" in shown and "nothing freed" in shown, shown


@pytest.mark.slow
def test_a_changed_local_payload_is_kept_with_its_reason_and_the_next_oldest_goes(runs, archive):
    _, args = archive
    changed = art_of(runs, "b", 100)
    with open(changed / "model.pt", "r+b") as fh:
        fh.write(b"retrained in place")
    free = shutil.disk_usage(runs).free
    one = payload_bytes(art_of(runs, "a", 100))

    proc = keep_free(runs, args, free + one // 2)

    assert [r["path"] for r in proc.report["removed"]] == [str(art_of(runs, "a", 100))]
    assert "differ from the archived copy" in kept_reasons(proc.report)[str(changed)]
    assert payload_bytes(changed) > MODEL_BYTES


@pytest.mark.parametrize("value, nbytes, percent", [
    ("20G", 20 << 30, None), ("512M", 512 << 20, None), ("1.5GiB", 3 << 29, None), ("1000B", 1000, None),
    ("20GB", 20 << 30, None),
    ("15%", None, 15.0), (" 7.5 % ", None, 7.5),
])
def test_keep_free_spellings(value, nbytes, percent):
    target = parse_target(value)
    assert (target.nbytes, target.percent) == (nbytes, percent)


@pytest.mark.parametrize("value", ["", "G", "-5G", "101%", "20X", "15%%", "20iB", "1.5iB"])
def test_a_wrong_keep_free_is_a_usage_error(value):
    with pytest.raises(UsageError, match="--keep-free"):
        parse_target(value)


@pytest.mark.parametrize("value", ["20", "1073741824", " 7.5 ", 20])
def test_a_bare_number_is_not_a_size_and_is_refused_naming_the_units(value):
    with pytest.raises(UsageError, match="needs a unit") as refused:
        parse_target(value)
    assert "20G" in refused.value.remedy and "15%" in refused.value.remedy


@pytest.mark.slow
def test_cli_usage_errors_write_nothing(tmp_path):
    (tmp_path / "runs").mkdir()
    for args in (("--runs-root", str(tmp_path / "runs")),
                 ("--runs-root", str(tmp_path / "runs"), "--keep-free", "20Q"),
                 ("--runs-root", str(tmp_path / "runs"), "--keep-free", "20"),
                 ("--runs-root", str(tmp_path / "runs"), "--keep-free", "1G", "--keep-newest", "0"),
                 ("--paths", str(tmp_path / "runs"), "--keep-free", "1G")):
        proc = run_cli("prune-verified", *args)
        assert proc.returncode == 2, (args, proc.stderr)
    assert tree_bytes(tmp_path / "runs") == {}


HOLD_STAGE_LOCK = """
import sys, time
from pathlib import Path
from ckptflow.archive.stage import stage_lock
with stage_lock(Path(sys.argv[1]), 0):
    Path(sys.argv[2]).write_text("held")
    while Path(sys.argv[2]).exists():
        time.sleep(0.05)
"""


@pytest.mark.slow
def test_an_artifact_whose_fetch_lock_is_held_is_kept_naming_the_holder(runs, archive, tmp_path):
    _, args = archive
    busy, flag = art_of(runs, "b", 100), tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_STAGE_LOCK, str(busy), str(flag)])
    try:
        wait_for_file(flag, holder)
        proc = keep_free(runs, args, "100%")
        reason = kept_reasons(proc.report)[str(busy)]
        assert f"pid {holder.pid}" in reason and "iter_000100.lock" in reason
        assert payload_bytes(busy) > MODEL_BYTES
        assert str(art_of(runs, "a", 100)) in [r["path"] for r in proc.report["removed"]]
    finally:
        flag.unlink(missing_ok=True)
        holder.wait(timeout=60)
    again = keep_free(runs, args, "100%")
    assert [r["path"] for r in again.report["removed"]] == [str(busy)]


@pytest.mark.slow
def test_only_artifacts_on_the_runs_roots_file_system_are_freed_and_the_dry_run_plans_the_same(tmp_path):
    store = LocalStore(tmp_path / "archive")
    store.root.mkdir()
    assert run_probe(store, "scratch").record.passed
    with tmpfs_mounts(tmp_path / "disks") as mount:
        root = mount(64 * MiB) / "runs"
        (root / "proj" / "group").mkdir(parents=True)
        with tmpfs_mounts(root / "proj" / "group") as inner:  # run "disk0" lives on a file system of its own
            elsewhere = inner(64 * MiB)
            # The other file system's artifacts were published first: oldest first would pick them first.
            for seed, (run, iteration, at) in enumerate([(elsewhere.name, 100, "2026-11-29T00:00:00Z"),
                                                         (elsewhere.name, 200, "2026-11-29T00:30:00Z"),
                                                         ("a", 100, "2026-11-29T01:00:00Z"),
                                                         ("a", 200, "2026-11-29T02:00:00Z")]):
                art = make_artifact(run_dir(root, run), iteration=iteration, model_bytes=MODEL_BYTES, seed=seed)
                (art / "optim.pt").unlink()
                publish_artifact(art, store, f"proj/group/{run}/{TS}/checkpoints", progress=False)
                rec = receipt_record.read_receipt(art)
                receipt_record.write_receipt(art, receipt_record.Receipt(
                    rec.destination, rec.declaration_sha256, rec.files, at, rec.server_checksums,
                    rec.earlier_destinations))
            other, mine = art_of(root, elsewhere.name, 100), art_of(root, "a", 100)
            free = shutil.disk_usage(root).free
            target = free + payload_bytes(mine) // 2  # one artifact of the runs root's file system is enough

            dry = keep_free(root, (), target, "--dry-run")
            real = keep_free(root, (), target)

            assert dry.returncode == real.returncode == 0, (dry.stderr, real.stderr)
            assert [r["path"] for r in dry.report["removed"]] == [r["path"] for r in real.report["removed"]] == [str(mine)]
            assert payload_bytes(other) > MODEL_BYTES and payload_bytes(mine) == 0
            for proc in (dry, real):
                assert "another file system" in kept_reasons(proc.report)[str(other)]
                assert not any(k.get("error") for k in proc.report["kept"])
            measured = shutil.disk_usage(root).free
            assert real.report["keep_free"]["met"] and real.report["keep_free"]["free_after"] == measured >= target
            assert dry.report["keep_free"]["met"] and dry.report["keep_free"]["free_after"] == measured
