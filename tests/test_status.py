"""``ckptflow status``: one row per (run, iteration), read from the records that the steps really write."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptflow.archive.fetch import fetch_artifact
from ckptflow.archive.publish import publish_artifact
from ckptflow.digest import sha256_bytes
from ckptflow.errors import NotFound
from ckptflow.jsonio import validate
from ckptflow.records import LegacyRecord, merge_progress, merge_record
from ckptflow.records import manifest as manifest_record
from ckptflow.records import materialized as materialized_record
from ckptflow.records import receipt as receipt_record
from ckptflow.records import staging as staging_record
from ckptflow.records.inventory import FileEntry
from ckptflow.status import collect_status
from ckptflow.store.credentials import load_credentials
from ckptflow.store.open import store_factory
from ckptflow.store.s3 import S3Store
from ckptflow.workflow.steps import prune_step, publish_step, status_step, verify_step
from helpers import REPO
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact
from helpers.cli import run_cli

RUN = "proj/group/run1/20261129T000000Z"  # the run of helpers.artifacts' UPLOAD_PREFIX
OTHER_RUN = "proj/group/run2/20261201T000000Z"
SHA = "a" * 64


@pytest.fixture(autouse=True)
def probe_cache(tmp_path, monkeypatch):
    """Probe records (prune's endpoint qualification) go to a per-test cache, never to ~/.cache."""
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(tmp_path / "cache"))


def write_merge_record(artifact: Path, *, mode: str = "tv", experts: int = 3) -> None:
    model = manifest_record.read_manifest(artifact).components["model"]
    merge_record.write_merge_record(artifact, merge_record.MergeRecord(
        tool_version="0.1.0",
        request=merge_record.MergeRequest(
            mode=mode, experts=tuple(merge_record.Expert(f"/ckpt/e{i}/model.pt", 10 + i, SHA) for i in range(experts)),
            base=None, lam=0.5, iteration=manifest_record.read_manifest(artifact).iteration),
        outputs=(FileEntry("model.pt", model.size, model.sha256),),
    ))


def write_teacher(teacher: Path, source_uri: str | None, model: Path | None = None) -> None:
    """A teacher record built from ``model`` (an artifact's model.pt: its digest and size), else from SHA."""
    teacher.mkdir(parents=True)
    (teacher / "model.safetensors").write_bytes(b"s" * 1000)  # the shard the record names, at its size
    source = (sha256_bytes(model.read_bytes()), model.stat().st_size) if model else (SHA, 1234)
    materialized_record.write_materialized(teacher, materialized_record.Materialized(
        conversion_version="1",
        source=materialized_record.SourceIdentity(source_uri, *source),
        base=materialized_record.BaseModelIdentity("/models/base", SHA, None),
        options={"unified_chat_template": False},
        shards=(FileEntry("model.safetensors", 1000, SHA),),
        tensor_count=42,
    ))


@pytest.fixture
def runs(tmp_path) -> dict[str, Path]:
    """A runs root where each iteration of ``RUN`` is in one state, reached through the library's own steps.

    100 committed · 200 incomplete (no manifest) · 300 merged · 400 legacy plain-text receipt ·
    500 published, verified, pruned, staged and materialized from the archive · 600 published and verified,
    then its receipt rewritten (the report is stale); ``OTHER_RUN`` has only a teacher built from a local artifact.
    """
    root, archive = tmp_path / "runs", tmp_path / "archive"
    reports, stage, teachers = tmp_path / "reports", tmp_path / "stage", tmp_path / "teachers"
    archive.mkdir()
    run_dir = root / RUN
    arts = {it: make_artifact(run_dir, iteration=it, seed=it) for it in (100, 300, 400, 500, 600)}
    incomplete = run_dir / "checkpoint_artifacts" / "iter_000200"
    incomplete.mkdir()
    (incomplete / "model.pt").write_bytes(b"x" * 1000)
    write_merge_record(arts[300])
    (arts[400] / ".uploaded").write_text("uploaded by the old sync script 2024-05-01\n")
    bucket = f"file://{archive}"
    for it in (500, 600):
        (arts[it] / "optim.pt").unlink()  # an unselected file would (rightly) block pruning
        publish_step(str(arts[it]), UPLOAD_PREFIX, bucket, None)
        verify_step(str(arts[it]), None, str(reports / "verify" / RUN / f"iter_{it:06d}.json"))
    for it in (100, 400, 500):
        prune_step(str(arts[it]), None, str(reports / "prune" / RUN / f"iter_{it:06d}.json"))
    receipt = receipt_record.read_receipt(arts[600])
    os.utime(reports / "verify" / RUN / "iter_000600.json", (time.time() - 60,) * 2)
    receipt_record.write_receipt(arts[600], receipt)  # newer than its verify report
    uri = f"{bucket}/{ARTIFACT_PREFIX.replace('iter_000300', 'iter_000500')}"
    fetch_artifact(uri, stage / RUN, progress=False)
    write_teacher(teachers / RUN / "iter_000500", uri, stage / RUN / "iter_000500" / "model.pt")
    write_teacher(teachers / OTHER_RUN / "iter_000700", None)
    return {"root": root, "run": run_dir, "reports": reports, "stage": stage, "teachers": teachers, "archive": archive}


def collect(runs: dict[str, Path], root: Path | None = None, **kwargs):
    return collect_status(root or runs["root"], reports_dir=runs["reports"], stage_dir=runs["stage"],
                          teachers_dir=runs["teachers"], **kwargs)


def states(report: dict) -> dict[tuple[str, int], dict[str, str]]:
    columns = ("local", "merged", "published", "verified", "pruned", "staged", "materialized")
    return {(r["run"], r["iteration"]): {c: r[c]["state"] for c in columns} for r in report["rows"]}


def test_every_iteration_shows_the_state_its_records_prove(runs):
    report = collect(runs).to_report()
    validate(report, "report_status", what="status report")
    got = states(report)
    assert list(got) == [(RUN, 100), (RUN, 200), (RUN, 300), (RUN, 400), (RUN, 500), (RUN, 600), (OTHER_RUN, 700)]
    none = {"merged": "none", "published": "none", "verified": "none", "pruned": "none", "staged": "none",
            "materialized": "none"}
    assert got[(RUN, 100)] == {**none, "local": "committed", "pruned": "kept"}
    assert got[(RUN, 200)] == {**none, "local": "incomplete"}
    assert got[(RUN, 300)] == {**none, "local": "committed", "merged": "merged"}
    assert got[(RUN, 400)] == {**none, "local": "committed", "published": "legacy-receipt", "pruned": "kept"}
    assert got[(RUN, 500)] == {"local": "committed", "merged": "none", "published": "receipt",
                               "verified": "verified", "pruned": "pruned", "staged": "staged",
                               "materialized": "materialized"}
    assert got[(RUN, 600)] == {**none, "local": "committed", "published": "receipt", "verified": "verified"}
    assert got[(OTHER_RUN, 700)] == {**none, "local": "absent", "materialized": "materialized"}
    assert report["counts"] == {
        "iterations": 7, "runs": 2, "committed": 5, "incomplete": 1, "merged": 1, "published": 2,
        "legacy_receipts": 1, "verified": 1, "pruned": 1, "staged": 1, "materialized": 2, "attention": 4,
    }


def test_cells_carry_the_data_an_operator_needs(runs):
    rows = {(r["run"], r["iteration"]): r for r in collect(runs).to_report()["rows"]}
    merged = rows[(RUN, 300)]["merged"]
    assert (merged["mode"], merged["experts"], merged["lam"]) == ("tv", 3, 0.5)
    pruned = rows[(RUN, 500)]
    manifest = manifest_record.read_manifest(runs["run"] / "checkpoint_artifacts" / "iter_000500")
    payload = sum(e.size for e in manifest.physical_files())
    assert pruned["local_bytes"] == 0 and pruned["pruned"]["files"] == len(manifest.physical_files())
    assert pruned["archived_bytes"] == payload  # its payload files' bytes, as seal and ls count them
    assert pruned["verified"]["source"] == "report" and "stale" not in pruned["verified"]
    assert pruned["materialized"]["source"] == "archive" and pruned["materialized"]["path"].endswith(f"{RUN}/iter_000500")
    assert pruned["staged"]["source_uri"].endswith("checkpoint_artifacts/iter_000500")
    kept = manifest_record.read_manifest(runs["run"] / "checkpoint_artifacts" / "iter_000100")
    assert rows[(RUN, 100)]["local_bytes"] == sum(e.size for e in kept.physical_files())
    assert rows[(RUN, 200)]["local_bytes"] == 1000 and rows[(RUN, 200)]["artifact_dir"].endswith("iter_000200")
    stale = rows[(RUN, 600)]["verified"]
    assert stale["stale"] is True and "newer" in stale["detail"]
    assert "receipt" in rows[(RUN, 100)]["pruned"]["detail"]  # why prune kept it
    assert rows[(OTHER_RUN, 700)]["materialized"]["source"] == "local" and rows[(OTHER_RUN, 700)]["artifact_dir"] is None


def test_a_legacy_receipt_is_shown_as_such_and_never_as_verified(runs):
    row = next(r for r in collect(runs).to_report()["rows"] if r["iteration"] == 400)
    assert row["published"]["state"] == "legacy-receipt" and "legacy" in row["published"]["detail"]
    assert row["verified"]["state"] == "none" and row["archived_bytes"] is None
    assert "legacy" in row["pruned"]["detail"]
    with pytest.raises(LegacyRecord, match="legacy"):
        verify_step(row["artifact_dir"], None, str(runs["reports"] / "x.json"))
    table = collect(runs).render()
    line = next(line for line in table.splitlines() if "iter_000400" in line and RUN in line)
    assert "legacy receipt" in line and "verified" not in line


def test_corrupt_records_are_shown_in_their_own_cells(runs):
    art = runs["run"] / "checkpoint_artifacts"
    (art / "iter_000300" / ".merge-complete.json").write_text("{not json")
    (art / "iter_000600" / ".uploaded").write_text('{"protocol": "posttrain.archive-marker.v1"}')
    (runs["stage"] / RUN / "iter_000500" / ".staged.json").write_bytes(b"\xef\xbb\xbf{}")
    (runs["reports"] / "verify" / RUN / "iter_000500.json").write_text("[]")
    corrupt_manifest = make_artifact(runs["run"], iteration=800)
    (corrupt_manifest / ".posttrain-checkpoint-artifact.json").write_text('{"schema": "posttrain.checkpoint-artifact.v9"}')
    status = collect(runs)
    report = status.to_report()
    validate(report, "report_status", what="status report")
    got = states(report)
    assert got[(RUN, 300)]["merged"] == "corrupt"
    assert got[(RUN, 600)]["published"] == "corrupt" and got[(RUN, 600)]["verified"] == "verified"
    assert got[(RUN, 500)]["staged"] == "corrupt" and got[(RUN, 500)]["verified"] == "corrupt"
    assert got[(RUN, 800)]["local"] == "corrupt"
    rows = {r["iteration"]: r for r in report["rows"] if r["run"] == RUN}
    assert "upgrade ckptflow" in rows[800]["local"]["detail"]
    assert "no receipt now" in rows[600]["verified"]["detail"]  # a report without a valid receipt proves nothing
    table = status.render()
    assert table.count("corrupt") >= 4 and "byte-order mark" in table


def test_interrupted_steps_show_what_they_left(runs):
    art = runs["run"] / "checkpoint_artifacts"
    (art / "iter_000600" / "model.pt").unlink()  # one payload of a published artifact gone: an interrupted prune
    (art / "iter_000100" / "optim" / "__0_0.distcp").unlink()  # gone without any receipt
    (art / "iter_000200" / "model.pt").write_bytes(b"m" * 10)
    merge_progress.write_merge_progress(art / "iter_000200", merge_progress.MergeProgress(
        (merge_progress.FileState.of(art / "iter_000200" / "model.pt"),)))
    staged = runs["stage"] / RUN / "iter_000600"
    staged.mkdir(parents=True)
    staging_record.write_staging(staged, staging_record.StagingRecord(
        "file:///archive/iter_000600", None, (FileEntry("model.pt", 4, SHA),), complete=False))
    (runs["teachers"] / RUN / "iter_000300").mkdir(parents=True)  # a build that never finished
    report = collect(runs).to_report()
    validate(report, "report_status", what="status report")
    got = states(report)
    assert got[(RUN, 600)]["pruned"] == "partial" and got[(RUN, 100)]["pruned"] == "missing"
    assert got[(RUN, 200)]["merged"] == "in-progress" and got[(RUN, 200)]["local"] == "incomplete"
    assert got[(RUN, 600)]["staged"] == "incomplete" and got[(RUN, 300)]["materialized"] == "unrecorded"
    rows = {r["iteration"]: r for r in report["rows"] if r["run"] == RUN}
    assert rows[600]["pruned"]["files"] == 1 and "interrupted prune" in rows[600]["pruned"]["detail"]
    assert "no receipt" in rows[100]["pruned"]["detail"]


def test_the_table_is_aligned_and_names_every_iteration(runs):
    table = collect(runs).render()
    lines = table.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("RUN"))
    body = lines[header + 1: header + 8]
    for name in ("iter_000100", "iter_000200", "iter_000300", "iter_000400", "iter_000500", "iter_000600",
                 "iter_000700"):
        assert sum(name in line for line in body) == 1, table
    columns = [lines[header].index(h) for h in ("ITERATION", "LOCAL", "MERGED", "PUBLISHED", "VERIFIED")]
    for line in body:
        assert all(line[c - 2: c] == "  " and line[c] != " " for c in columns), line
    assert "tv, 3 experts" in table and "legacy receipt" in table and "(archive)" in table
    assert "7 iterations in 2 runs" in table and "details:" in table


def test_a_run_directory_shows_only_that_run(runs):
    report = collect(runs, root=runs["run"]).to_report()
    validate(report, "report_status", what="status report")
    got = states(report)
    assert {run for run, _ in got} == {RUN} and len(got) == 6
    assert got[(RUN, 500)]["staged"] == "staged" and got[(RUN, 500)]["materialized"] == "materialized"


def test_only_what_is_asked_for_is_read(runs):
    report = collect_status(runs["root"]).to_report()
    got = states(report)
    # The workflow's verify recorded its outcome beside the receipt, as `ckptflow verify` does: status
    # shows it from that record without the reports (which it does not read).
    row = next(r for r in report["rows"] if (r["run"], r["iteration"]) == (RUN, 500))
    assert row["verified"]["state"] == "verified" and row["verified"]["source"] == "record", row["verified"]
    assert got[(RUN, 500)]["staged"] == "none"
    assert (OTHER_RUN, 700) not in got
    assert "not read" not in collect_status(runs["root"]).render()  # no workflow directory asked for: no word of them
    asked = collect_status(runs["root"], teachers_dir=runs["teachers"]).render()
    assert "not read: verify/prune reports (--reports-dir), staged copies (--stage-dir)\n" in asked


def test_a_missing_root_is_refused(tmp_path):
    with pytest.raises(NotFound, match="runs root"):
        collect_status(tmp_path / "nowhere")
    proc = run_cli("status", str(tmp_path / "nowhere"))
    assert proc.returncode == 1 and proc.report["status"] == "failed"


def test_status_step_writes_the_report_and_the_table(runs, tmp_path):
    out = tmp_path / "out"
    report = status_step(str(runs["root"]), str(runs["reports"]), str(runs["stage"]), str(runs["teachers"]),
                         str(out / "status.json"), str(out / "status.txt"))
    written = json.loads((out / "status.json").read_text())
    validate(written, "report_status", what="status.json")
    assert written == report and written["counts"]["iterations"] == 7
    text = (out / "status.txt").read_text()
    assert all(f"iter_{it:06d}" in text for it in (100, 200, 300, 400, 500, 600, 700))


# ------------------------------------------------------------------------------------------- the CLI


def cli_args(runs: dict[str, Path]) -> list[str]:
    return ["status", str(runs["root"]), "--reports-dir", str(runs["reports"]), "--stage-dir", str(runs["stage"]),
            "--teachers-dir", str(runs["teachers"])]


def test_cli_prints_the_json_report_when_stdout_is_not_a_terminal(runs):
    for extra in ([], ["--json"]):
        proc = run_cli(*cli_args(runs), *extra)
        assert proc.returncode == 0, proc.stderr
        validate(proc.report, "report_status", what="status report")
        assert proc.report["counts"]["iterations"] == 7 and proc.report["verify_live"] is False


def run_on_a_terminal(*args: str) -> tuple[int, str, str]:
    """Run the CLI with stdout on a pseudo-terminal; (exit code, what the terminal showed, stderr)."""
    primary, secondary = pty.openpty()
    env = {**os.environ, "CKPTFLOW_PROGRESS": "0", "COLUMNS": "250"}
    proc = subprocess.Popen([sys.executable, "-m", "ckptflow", *args], stdout=secondary, stderr=subprocess.PIPE,
                            cwd=REPO, env=env)
    os.close(secondary)
    chunks = []
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(primary)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, b"".join(chunks).decode().replace("\r\n", "\n"), err.decode()


def test_cli_prints_the_table_on_a_terminal_and_json_with_json(runs):
    code, out, err = run_on_a_terminal(*cli_args(runs))
    assert code == 0, err
    assert out.startswith("ckptflow status of") and "iter_000700" in out
    assert "{" not in out.splitlines()[-1]
    code, out, err = run_on_a_terminal(*cli_args(runs), "--json")
    assert code == 0, err
    validate(json.loads(out), "report_status", what="status --json on a terminal")


# ------------------------------------------------------------------------- --verify against SeaweedFS


@pytest.fixture
def published_on_seaweedfs(tmp_path, seaweedfs_bucket, seaweedfs_credentials_path) -> S3Store:
    """``runs/RUN/checkpoint_artifacts/iter_000300`` published to a fresh SeaweedFS bucket; its store."""
    store = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path))
    art = make_artifact(tmp_path / "runs" / RUN, iteration=300)
    publish_artifact(art, store, UPLOAD_PREFIX, progress=False)
    return store


@pytest.mark.slow
def test_verify_checks_the_archive_live_and_fails_on_a_changed_object(published_on_seaweedfs, tmp_path,
                                                                        seaweedfs_credentials_path):
    store = published_on_seaweedfs
    root = tmp_path / "runs"
    live = collect_status(root, verify_with=store_factory(str(seaweedfs_credentials_path))).to_report()
    validate(live, "report_status", what="status --verify report")
    assert live["status"] == "ok" and live["verify_live"] is True
    assert live["rows"][0]["verified"]["state"] == "verified" and live["rows"][0]["verified"]["source"] == "live"

    proc = run_cli("status", str(root), "--verify", "--credentials", str(seaweedfs_credentials_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.report["rows"][0]["verified"]["state"] == "verified"

    key = f"{ARTIFACT_PREFIX}/optim/__0_0.distcp"
    store._client.put_object(Bucket=store.bucket, Key=key, Body=b"tampered", Metadata={"sha256": "0" * 64})
    proc = run_cli("status", str(root), "--verify", "--credentials", str(seaweedfs_credentials_path))
    assert proc.returncode == 1 and "failed live verification" in proc.stderr
    validate(proc.report, "report_status", what="failed status --verify report")
    row = proc.report["rows"][0]
    assert proc.report["status"] == "failed" and row["verified"]["state"] == "failed"
    assert "optim/__0_0.distcp" in row["verified"]["detail"]
    assert f"s3://{store.bucket}/" in row["verified"]["detail"]  # named by the destination of the copy


def test_without_verify_the_store_is_never_opened(published_on_seaweedfs, tmp_path):
    broken = tmp_path / "no-such-credentials.json"
    proc = run_cli("status", str(tmp_path / "runs"), "--credentials", str(broken),
                   env={"CKPTFLOW_CREDENTIALS": str(broken)})
    assert proc.returncode == 0, proc.stderr
    assert proc.report["rows"][0]["published"]["state"] == "receipt"
    assert proc.report["rows"][0]["verified"]["state"] == "none"
    proc = run_cli("status", str(tmp_path / "runs"), "--verify", "--credentials", str(broken))
    assert proc.returncode == 1 and proc.report["rows"][0]["verified"]["state"] == "error"


# ------------------------------------------------------------------------------------------ at scale


def write_minimal_artifacts(root: Path, count: int, *, runs: int = 4) -> None:
    """``count`` committed artifacts (a 4-byte model.pt and a manifest each) across ``runs`` runs; every
    third holds a receipt, every fifth lost its payload (pruned when it holds a receipt)."""
    for i in range(count):
        art = root / f"proj/group/run{i % runs}/20261129T000000Z" / "checkpoint_artifacts" / f"iter_{i:06d}"
        art.mkdir(parents=True)
        manifest = manifest_record.Manifest(iteration=i, components={
            "model": manifest_record.FileComponent("model.pt", 4, SHA)})
        data = manifest_record.encode_manifest(manifest)
        if i % 5:
            (art / "model.pt").write_bytes(b"abcd")
        (art / manifest_record.FILENAME).write_bytes(data)  # committed last, as every writer commits it
        if i % 3 == 0:  # bound to its artifact as publication binds it: the manifest's digest, its iter_N
            receipt = receipt_record.Receipt(
                receipt_record.ReceiptDestination("s3", "s3.example:443", "b", f"p/iter_{i:06d}"), SHA,
                (FileEntry("model.pt", 4, SHA), FileEntry(manifest_record.FILENAME, len(data), sha256_bytes(data))),
                "2026-01-01T00:00:00Z")
            (art / receipt_record.FILENAME).write_bytes(receipt_record.encode_receipt(receipt))


def test_a_thousand_artifacts_are_counted_right(tmp_path):
    write_minimal_artifacts(tmp_path / "runs", 1000)
    report = collect_status(tmp_path / "runs").to_report()
    counts = report["counts"]
    assert counts["iterations"] == 1000 and counts["runs"] == 4 and counts["committed"] == 1000
    assert counts["published"] == 334  # i % 3 == 0 for i in 0..999
    assert counts["pruned"] == 67  # i % 15 == 0
    assert sum(r["pruned"]["state"] == "missing" for r in report["rows"]) == 200 - 67
    assert report["local_bytes"] == 800 * 4 and report["archived_bytes"] == 334 * 4
    assert [r["iteration"] for r in report["rows"] if r["run"].endswith("run1/20261129T000000Z")][:3] == [1, 5, 9]



# ------------------------------------------------------------------- what a record names is really there


def cli_states(runs: dict[str, Path]) -> tuple[dict, dict[tuple[str, int], dict[str, str]]]:
    """The real `ckptflow status` (JSON report) and its states per row."""
    proc = run_cli(*cli_args(runs))
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_status", what="status report")
    rows = {(r["run"], r["iteration"]): r for r in proc.report["rows"]}
    return rows, states(proc.report)


def test_a_receipt_copied_from_another_artifact_is_foreign_and_proves_nothing(runs):
    """500 is published, verified and pruned; 600 published and verified with its payloads here. A copy
    of 500's receipt (mtime kept) in 600, and of 600's in 100, is shown as foreign, never as published:
    the verify report no longer counts and 100's missing payload is not "pruned"."""
    arts = runs["run"] / "checkpoint_artifacts"
    shutil.copy2(arts / "iter_000500" / ".uploaded", arts / "iter_000600" / ".uploaded")
    (arts / "iter_000100" / "model.pt").unlink()
    shutil.copy2(arts / "iter_000600" / ".uploaded", arts / "iter_000100" / ".uploaded")
    rows, got = cli_states(runs)
    assert got[(RUN, 600)]["published"] == "foreign" and got[(RUN, 100)]["published"] == "foreign"
    assert rows[(RUN, 600)]["verified"]["stale"] is True and got[(RUN, 600)]["pruned"] == "none"
    assert got[(RUN, 100)]["pruned"] == "missing"  # no receipt of its own proves an archived copy
    assert "iter_000500" in rows[(RUN, 600)]["published"]["detail"]
    assert "another artifact" in rows[(RUN, 600)]["published"]["detail"]
    assert rows[(RUN, 600)]["archived_bytes"] is None
    assert got[(RUN, 500)]["published"] == "receipt"  # the original is still its own


def test_a_receipt_of_the_same_name_but_another_manifest_is_foreign(runs):
    """Two runs' iter_000500: the prefix's last segment matches, the manifest digest does not."""
    other = make_artifact(runs["root"] / OTHER_RUN, iteration=500, seed=9)
    shutil.copy2(runs["run"] / "checkpoint_artifacts" / "iter_000500" / ".uploaded", other / ".uploaded")
    rows, got = cli_states(runs)
    assert got[(OTHER_RUN, 500)]["published"] == "foreign"
    assert "manifest sha256" in rows[(OTHER_RUN, 500)]["published"]["detail"]


def test_prune_refuses_a_receipt_copied_from_another_artifact(runs):
    arts = runs["run"] / "checkpoint_artifacts"
    shutil.copy2(arts / "iter_000500" / ".uploaded", arts / "iter_000600" / ".uploaded")
    before = {p: p.read_bytes() for p in (arts / "iter_000600").rglob("*") if p.is_file()}
    proc = run_cli("prune-verified", "--paths", str(arts / "iter_000600"))
    assert proc.report["removed"] == [] and "another artifact" in proc.report["kept"][0]["reason"], proc.report
    assert {p: p.read_bytes() for p in (arts / "iter_000600").rglob("*") if p.is_file()} == before


def test_a_stage_or_teacher_whose_files_are_gone_or_resized_is_partial_or_damaged(runs):
    staged = runs["stage"] / RUN / "iter_000500"
    teacher = runs["teachers"] / RUN / "iter_000500"
    local = runs["teachers"] / OTHER_RUN / "iter_000700"
    (staged / "model.pt").unlink()
    (local / "model.safetensors").unlink()
    _, got = cli_states(runs)
    assert got[(RUN, 500)]["staged"] == "partial" and got[(OTHER_RUN, 700)]["materialized"] == "partial"
    assert got[(RUN, 500)]["materialized"] == "materialized"
    (teacher / "model.safetensors").write_bytes(b"short")
    (staged / "model.pt").write_bytes(b"not the fetched bytes")
    rows, got = cli_states(runs)
    assert got[(RUN, 500)]["staged"] == "damaged" and got[(RUN, 500)]["materialized"] == "damaged"
    assert "has 5 bytes, .materialized says 1000" in rows[(RUN, 500)]["materialized"]["detail"]
    counts = run_cli(*cli_args(runs)).report["counts"]
    assert counts["staged"] == 0 and counts["materialized"] == 0


def test_a_payload_of_another_size_makes_the_local_artifact_damaged(runs):
    art = runs["run"] / "checkpoint_artifacts" / "iter_000300"
    with open(art / "model.pt", "ab") as fh:
        fh.write(b"x")
    rows, got = cli_states(runs)
    assert got[(RUN, 300)]["local"] == "damaged" and "model.pt has 300001 bytes" in rows[(RUN, 300)]["local"]["detail"]
    assert got[(RUN, 100)]["local"] == "committed"


@pytest.mark.slow
def test_a_teacher_built_from_another_model_than_the_artifacts_is_foreign(runs):
    """A teacher of iteration 600 built from iteration 500's archive (what a copied receipt led to)."""
    uri_500 = run_cli(*cli_args(runs)).report["rows"][4]["staged"]["source_uri"]
    write_teacher(runs["teachers"] / RUN / "iter_000600", uri_500, runs["stage"] / RUN / "iter_000500" / "model.pt")
    rows, got = cli_states(runs)
    assert got[(RUN, 600)]["materialized"] == "foreign" and got[(RUN, 500)]["materialized"] == "materialized"
    assert "was built from a model.pt of sha256" in rows[(RUN, 600)]["materialized"]["detail"]
    assert run_cli(*cli_args(runs)).report["counts"]["materialized"] == 2  # 500's and 700's


def test_the_compact_table_never_cuts_a_word_and_fits_every_width(runs):
    """From the narrowest terminal to one where the full layout fits: no line is wider than the terminal,
    and every cell of the table shows whole words of its value (its leading words and ``…``, never
    ``comm…ted``); a column left out for want of width is named."""
    import re
    from datetime import datetime, timezone

    from ckptflow.status.render import COMPACT_HEADERS, compact_cells, render_report

    report = collect(runs).to_report()
    now = datetime.now(timezone.utc)
    values = {w for r in report["rows"] for cell in compact_cells(r, now) for w in cell.split()}
    values |= {*COMPACT_HEADERS, "…"}
    compact = 0
    for width in range(40, 200, 3):
        text = render_report(report, width=width, now=now)
        lines = text.split("\ndetails")[0].splitlines()  # a detail's path stays whole, to be copied
        assert max(map(len, lines)) <= width, (width, text)
        if not any(line.lstrip().startswith("ITER  ") for line in lines):
            continue  # the full layout fitted: nothing is shortened
        compact += 1
        start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ITER  "))
        end = next(i for i, line in enumerate(lines) if re.match(r"\d+ iterations? in ", line))
        for line in lines[start:end]:
            if not line.startswith("  "):
                continue  # a run's name (a path, shortened in its middle when it must be)
            cut = [w for w in line.split() if w not in values]
            assert not cut, (width, line, cut)
        if "not shown for want of width" in text:
            assert "--wide shows every column" in text
    assert compact >= 5  # the compact table was drawn at several widths
