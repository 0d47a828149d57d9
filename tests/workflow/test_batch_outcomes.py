"""The batch jobs' reports and outcomes: every report a batch writes validates against its schema and
`status` (the CLI and the workflow's target, and `make demo`'s check of its table) reads it as verified and
pruned; an outcome is used only by the planning that produced it, so a rerun publishes, verifies and prunes
afresh what is pending, on file:// and SeaweedFS."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import yaml
from workflow_helpers import RUN, SNAKEMAKE, Flow

from ckptflow.jsonio import validate
from helpers import REPO, preloaded, servers
from helpers.artifacts import make_artifact
from helpers.cli import run_cli

pytestmark = pytest.mark.slow

CHECK_STATUS = REPO / "demo" / "check_status.py"
SCHEMAS = {"publish": "report_publish", "verify": "report_verify", "prune": "report_prune_verified"}


def _check_status(status_json: Path) -> subprocess.CompletedProcess:
    """The check `make demo` runs on its final status table (demo/demo.sh)."""
    return subprocess.run([str(SNAKEMAKE.with_name("python")), str(CHECK_STATUS), str(status_json)],
                          capture_output=True, text=True, timeout=120)


def _rows_clean(report: dict) -> None:
    for row in report["rows"]:
        where = f"{row['run']} {row['name']}"
        assert row["local"]["state"] == "committed", (where, row["local"])
        assert row["published"]["state"] == "receipt", (where, row["published"])
        assert row["verified"]["state"] == "verified" and not row["verified"].get("stale"), (where, row["verified"])
        assert row["pruned"]["state"] == "pruned", (where, row["pruned"])
        assert not any("detail" in row[c] for c in ("local", "published", "verified", "pruned")), (where, row)


def _snakemake_from(work: Path, site: Path, target: str, env: dict) -> subprocess.CompletedProcess:
    """``snakemake TARGET`` started in ``work`` with its site file (relative paths read against ``work``), forked
    from the test's Snakemake template (tests/helpers/preloaded.py) in that working directory."""
    return preloaded.snakemake([str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--cores", "2", "--configfile",
                                site.name, "--", target], env=env, cwd=work)


def test_status_reads_the_batch_reports_of_a_run_from_another_directory_as_verified_and_pruned(tmp_path):
    work, archive = tmp_path / "work", tmp_path / "archive"
    archive.mkdir()
    for it in (100, 300):
        (make_artifact(work / "runs" / RUN, iteration=it, seed=it) / "optim.pt").unlink()
    site = work / "site.yaml"
    site.write_text(yaml.safe_dump({"runs_root": "runs", "bucket": f"file://{archive}", "reports_dir": "reports",
                                    "logs_dir": "logs", "stage_dir": "stage", "teachers_dir": "teachers"}))
    env = {**os.environ, "CKPTFLOW_CACHE_DIR": str(tmp_path / "cache"), "CKPTFLOW_PROGRESS": "0"}
    for target in ("publish_all", "verify_all", "prune_all", "status"):
        done = _snakemake_from(work, site, target, env)
        assert done.returncode == 0, done.stdout + done.stderr

    reports = work / "reports"
    for step, schema in SCHEMAS.items():
        found = sorted((reports / step).rglob("iter_*[0-9].json"))
        assert len(found) == 2, found
        for path in found:
            report = json.loads(path.read_bytes())
            assert report.get("batch"), path  # written from a batch's outcome
            validate(report, schema, what=str(path))

    # The CLI without the workflow's reports, with them, and the workflow's own table.
    bare = run_cli("status", str(work / "runs"), "--json", env={"CKPTFLOW_CACHE_DIR": env["CKPTFLOW_CACHE_DIR"]})
    assert bare.returncode == 0, bare.stderr
    _rows_clean(bare.report)
    full = run_cli("status", str(work / "runs"), "--reports-dir", str(reports), "--json")
    assert full.returncode == 0, full.stderr
    _rows_clean(full.report)
    table = json.loads((reports / "status.json").read_bytes())
    _rows_clean(table)
    assert table["counts"]["verified"] == 2 and table["counts"]["pruned"] == 2, table["counts"]
    assert table["counts"]["attention"] == 0, table["counts"]

    checked = _check_status(reports / "status.json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # A report status cannot read makes its row unclean, and the demo's check says which row and why.
    bad = reports / "verify" / RUN / "iter_000300.json"
    bad.write_text(json.dumps({**json.loads(bad.read_bytes()), "unknown": 1}))
    done = _snakemake_from(work, site, "status", env)
    assert done.returncode == 0, done.stdout + done.stderr
    checked = _check_status(reports / "status.json")
    out = checked.stdout + checked.stderr
    assert checked.returncode == 1, out
    assert f"{RUN} iter_000300" in out and "verified" in out and "iter_000100" not in out, out


def test_the_demo_checks_its_final_status_table_and_stops_on_a_row_that_is_not_clean():
    """demo/demo.sh runs under ``set -e`` and checks the table the status target wrote, after that target:
    the check above (the same script on the table of the demo's workflow steps) fails it."""
    script = (REPO / "demo" / "demo.sh").read_text(encoding="utf-8")
    assert "set -euo pipefail" in script
    check = '$BIN/python demo/check_status.py "$REPORTS/status.json"'
    assert script.index(check) > script.index("smk status") > script.index("smk prune_all"), script
    assert script.index("REPORTS=$ROOT/reports") < script.index(check)


# ------------------------------------------------------------------ outcomes are never replayed


class FileArchive:
    """The file:// archive of a flow."""

    def __init__(self, tmp_path: Path):
        self.root = tmp_path / "archive"
        self.bucket = f"file://{self.root}"
        self.config: dict = {}

    def create(self) -> None:
        self.root.mkdir(exist_ok=True)

    def damage(self, iteration: int) -> None:
        """The archived model.pt of ``iteration`` rewritten with other bytes of the same size."""
        path = next(p for p in self.root.rglob("model.pt") if f"iter_{iteration:06d}" in str(p))
        size = path.stat().st_size
        path.unlink()
        path.write_bytes(b"\0" * size)

    def close(self) -> None:
        pass


class SeaweedArchive:
    """A bucket of the test's own on the shared SeaweedFS (created by ``create``)."""

    def __init__(self, credentials: Path):
        self.credentials = credentials
        self.name = f"ckptflow-t-{uuid.uuid4().hex[:16]}"
        self.bucket = f"s3://{self.name}"
        self.config = {"credentials": str(credentials)}
        self.created = False

    def create(self) -> None:
        servers.create_bucket(self.credentials, self.name)
        self.created = True

    def damage(self, iteration: int) -> None:
        s3 = servers.s3_client(self.credentials)
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=self.name)["Contents"]]
        key = next(k for k in keys if k.endswith(f"iter_{iteration:06d}/model.pt"))
        size = s3.head_object(Bucket=self.name, Key=key)["ContentLength"]
        s3.put_object(Bucket=self.name, Key=key, Body=b"\0" * size)

    def close(self) -> None:
        if self.created:
            servers.remove_bucket(self.credentials, self.name)


@pytest.fixture(params=["file", pytest.param("seaweedfs", marks=pytest.mark.seaweedfs)])
def archive(request, tmp_path):
    if request.param == "file":
        found = FileArchive(tmp_path)
    else:
        found = SeaweedArchive(request.getfixturevalue("seaweedfs_credentials_path"))
    yield found
    found.close()


def _flow(tmp_path: Path, archive, iterations=(100, 300)) -> Flow:
    flow = Flow(tmp_path / "flow", {"bucket": archive.bucket, **archive.config})
    for it in iterations:
        (make_artifact(flow.runs / RUN, iteration=it, seed=it) / "optim.pt").unlink()
    return flow


def test_a_publish_batch_that_failed_as_a_whole_publishes_once_the_cause_is_fixed(tmp_path, archive):
    flow = _flow(tmp_path, archive)
    out = flow.fails("publish_all")  # the file:// root or the bucket does not exist yet
    assert not (flow.artifact(100) / ".uploaded").exists() and not (flow.artifact(300) / ".uploaded").exists()
    assert "publish" in out
    archive.create()
    flow.ok("publish_all")
    for it in (100, 300):
        assert (flow.artifact(it) / ".uploaded").is_file(), it
        assert json.loads(flow.report("publish", it).read_bytes())["status"] in ("published", "adopted")
    flow.nothing_planned("publish_all")


def test_a_verify_asked_again_verifies_afresh_and_never_replays_an_earlier_batchs_outcome(tmp_path, archive):
    archive.create()
    flow = _flow(tmp_path, archive)
    flow.ok("publish_all")
    archive.damage(300)
    out = flow.fails("verify_all")  # 300 fails in the batch; 100 is verified
    assert f"{flow.artifact(300)}" in out, out
    assert json.loads(flow.report("verify", 100).read_bytes())["status"] == "verified"
    assert not flow.report("verify", 300).exists()
    # 100's archive damaged now, and its report removed: the documented way to ask for a verify again.
    archive.damage(100)
    flow.report("verify", 100).unlink()
    out = flow.fails("verify_all")
    assert not flow.report("verify", 100).exists(), flow.report("verify", 100).read_text()
    assert f"{flow.artifact(100)}" in out, out
    direct = run_cli("verify", "--artifact-dir", str(flow.artifact(100)), *(
        ["--credentials", archive.config["credentials"]] if archive.config else []), env=flow.env)
    assert direct.returncode == 1 and direct.report["status"] == "failed", direct.stdout + direct.stderr


def test_a_prune_asked_again_prunes_afresh_and_never_replays_an_earlier_batchs_outcome(tmp_path, archive):
    archive.create()
    flow = _flow(tmp_path, archive)
    if archive.config:  # pruning on S3 requires a passing probe of the endpoint
        probe = run_cli("probe", "--bucket", archive.bucket, "--prefix", "probe", "--credentials",
                        archive.config["credentials"], env=flow.env)
        assert probe.returncode == 0, probe.stdout + probe.stderr
    flow.ok("verify_all")
    with open(flow.artifact(300) / "model.pt", "r+b") as fh:
        fh.write(b"retrained in place")
    out = flow.fails("prune_all")  # 300 is kept and fails; 100 is pruned
    assert f"{flow.artifact(300)}: local bytes of ['model.pt'] differ" in out, out
    first = json.loads(flow.report("prune", 100).read_bytes())
    assert first["freed_bytes"] > 0 and not (flow.artifact(100) / "model.pt").exists()
    # 100's report removed (asked again): this run's prune finds nothing left to free and says so.
    flow.report("prune", 100).unlink()
    flow.fails("prune_all")
    again = json.loads(flow.report("prune", 100).read_bytes())
    assert again["freed_bytes"] == 0 and [f for e in again["removed"] for f in e["files"]] == [], again


def test_a_forced_rerun_of_a_verified_member_never_takes_the_outcome_a_failed_run_left(tmp_path):
    """The batch's output stays after a member failed (a temp() file whose consumer failed); `--forcerun
    verify` reruns the verified member's job, whose input it still is: the job verifies afresh."""
    archive = FileArchive(tmp_path)
    archive.create()
    flow = _flow(tmp_path, archive)
    flow.ok("publish_all")
    archive.damage(300)
    flow.fails("verify_all")
    assert json.loads(flow.report("verify", 100).read_bytes())["status"] == "verified"
    assert list((flow.root / "reports" / "batches" / "verify").glob("*[0-9a-f].json"))  # the outcomes stayed
    archive.damage(100)
    out = flow.fails("verify_all", "--forcerun", "verify")
    assert f"{flow.artifact(100)}" in out and not flow.report("verify", 100).exists(), out
