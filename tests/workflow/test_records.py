"""No Snakemake invocation deletes a record, and a lost receipt is re-derived from the archive.

Rule outputs are step reports only: Snakemake deletes a job's outputs before a rerun (code change,
params change, -F, -R, --forcerun), after a failure and on --delete-all-output, and touches them on
--touch. Each of these runs on a published, pruned and materialized artifact here, in a copy of the
workflow (so a test can touch its scripts), and every record stays byte for byte what it was.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from workflow_helpers import RUN, SNAKEMAKE, Flow, Snapshot, copy_workflow

from ckptflow.fsutil import walk_files
from ckptflow.records.receipt import ReceiptDestination
from ckptflow.trainer.retention import write_checkpoint_receipt
from helpers.artifacts import make_artifact

pytestmark = pytest.mark.slow

RECORDS = (".uploaded", ".posttrain-checkpoint-artifact.json", ".merge-complete.json")


def _archive(tmp_path: Path, name: str) -> str:
    (tmp_path / name).mkdir()
    return f"file://{tmp_path / name}"


def _records(flow: Flow, archive: Path) -> dict[str, bytes]:
    """Every record of the artifact, its stage and its teacher, and the archive's declaration."""
    out = {name: (flow.artifact() / name).read_bytes() for name in RECORDS}
    out[".staged.json"] = (flow.staged() / ".staged.json").read_bytes()
    out[".materialized"] = (flow.teacher() / ".materialized").read_bytes()
    for path in walk_files(archive):
        if path.endswith((".posttrain-archive.json", ".posttrain-checkpoint-artifact.json")):
            out[f"archive:{path}"] = (archive / path).read_bytes()
    return out


def _every_target_works(flow: Flow) -> None:
    flow.ok("publish_all", "prune_all", "verify_all", "status")
    flow.ok("materialize_teacher", iter=300)
    assert flow.planned("publish_all") == []


@dataclass(frozen=True)
class PrunedAfterUpdate:
    """The state the reported sequence leaves (published to A, pruned, materialized from the archive; then
    new publications go to B and the workflow checkout is updated), kept as a snapshot of ``work`` (the
    flow, the checkout and both archives). The tests using it form one xdist group (``INVOCATION_GROUP``),
    so they run one after another on one worker, which builds it once."""

    snapshot: Snapshot
    before: dict[str, bytes]

    @property
    def work(self) -> Path:
        return self.snapshot.root

    def restore(self) -> Flow:
        return self.snapshot.restore()


@pytest.fixture(scope="session")
def pruned_after_update(tmp_path_factory: pytest.TempPathFactory, kit) -> PrunedAfterUpdate:
    """Built once, on the one worker that runs the invocation tests; they only read it (each restores its own
    copy)."""
    base = tmp_path_factory.mktemp("pruned-after-update")
    work = base / "work"
    workflow = copy_workflow(work / "checkout")
    arch_a = _archive(work, "arch-a")
    flow = Flow(work / "flow", {
        "base": str(kit.base), "run": RUN, "bucket": arch_a, "materialize": {"min_tensors": 1},
        "merge": {"300": {"mode": "avg", "experts": [str(p) for p in kit.experts[:2]]}}}, workflow=workflow)
    flow.ok("merge_experts", iter=300)
    flow.ok("prune_all")
    flow.ok("materialize_teacher", iter=300)  # from the archive, through the stage: every record exists
    assert "model.pt" not in list(walk_files(flow.artifact()))
    before = _records(flow, work / "arch-a")

    # The reported sequence: new publications go to another bucket, the workflow checkout is updated.
    flow.config["bucket"] = _archive(work, "arch-b")
    now = time.time() + 5
    os.utime(workflow / "scripts" / "publish.py", (now, now))
    flow.ok("prune_all")
    assert _records(flow, work / "arch-a") == before
    assert list(walk_files(work / "arch-b")) == []  # nothing was published there
    _every_target_works(flow)
    return PrunedAfterUpdate(Snapshot.take(flow, base / "snapshot", root=work), before)


def _credentials_change(flow: Flow, tmp_path: Path) -> None:
    creds = tmp_path / "creds.json"
    creds.write_text("{}", encoding="utf-8")
    flow.config.update(credentials=str(creds))


# One test per invocation family, each from its own copy of the state the reported sequence leaves (so a
# failure names its invocation and leaves the others' evidence intact).
INVOCATIONS = {
    "params change": (_credentials_change, ("prune_all",)),
    "-F": (None, ("-F", "prune_all")),
    "-R publish": (None, ("prune_all", "-R", "publish")),
    "--forcerun": (None, ("prune_all", "--forcerun", "publish", "verify", "prune", "fetch", "materialize")),
    "-F materialize": (None, ("-F", "materialize_teacher")),
    "--touch": (None, ("--touch", "prune_all", "publish_all", "verify_all")),
    "--delete-all-output": (None, ("--delete-all-output", "prune_all")),
    "--delete-all-output materialize": (None, ("--delete-all-output", "materialize_teacher")),
}


# Sharing the snapshot across workers would need it rebuilt at each one's own path (about 50 s each).
INVOCATION_GROUP = "records-pruned-after-update"


@pytest.mark.xdist_group(INVOCATION_GROUP)
@pytest.mark.parametrize("name", list(INVOCATIONS))
def test_no_snakemake_invocation_deletes_a_record_of_a_pruned_artifact(name, pruned_after_update, tmp_path):
    flow = pruned_after_update.restore()
    archive_a = pruned_after_update.work / "arch-a"
    assert _records(flow, archive_a) == pruned_after_update.before
    change, args = INVOCATIONS[name]
    if change:
        change(flow, tmp_path)
    done = flow.run(*args, iter=300)
    assert done.returncode == 0, (name, done.stdout + done.stderr)
    assert _records(flow, archive_a) == pruned_after_update.before, name
    _every_target_works(flow)
    assert _records(flow, archive_a) == pruned_after_update.before, name
    assert list(walk_files(pruned_after_update.work / "arch-b")) == []


def test_a_lost_receipt_is_re_derived_from_the_archive_a_report_or_the_config_names(tmp_path):
    arch_a = _archive(tmp_path, "arch-a")
    flow = Flow(tmp_path / "flow", {"bucket": arch_a})
    art = make_artifact(flow.runs / RUN, iteration=300)
    (art / "optim.pt").unlink()  # an unselected file would (rightly) block pruning
    flow.ok("prune_all")
    receipt = json.loads((art / ".uploaded").read_text())
    assert "model.pt" not in list(walk_files(art))

    flow.config["bucket"] = _archive(tmp_path, "arch-b")  # new publications go elsewhere
    (art / ".uploaded").unlink()  # lost by accident while the payloads are pruned
    assert flow.planned("publish_all") == ["publish", "publish_all"]
    flow.ok("publish_all")  # re-derived at the destination the reports name, not published to B
    again = json.loads((art / ".uploaded").read_text())
    assert {k: v for k, v in again.items() if k != "uploaded_at"} == {
        k: v for k, v in receipt.items() if k != "uploaded_at"}
    assert list(walk_files(tmp_path / "arch-b")) == []
    flow.ok("prune_all", "verify_all")
    flow.nothing_planned("publish_all", "prune_all")

    # Lost again, with every report gone too: the configured bucket is the one left to name the archive.
    (art / ".uploaded").unlink()
    flow.ok("--delete-all-output", "prune_all")
    flow.config["bucket"] = arch_a
    assert sorted(flow.planned("publish_all")) == ["publish", "publish_all", "publish_batch"]
    flow.ok("prune_all")
    third = json.loads((art / ".uploaded").read_text())
    assert third["destination"] == receipt["destination"] and third["files"] == receipt["files"]
    assert json.loads(flow.report("publish").read_text())["status"] == "adopted"


def test_a_full_checkpoint_receipt_in_an_artifact_is_pending_and_replaced_by_publication(tmp_path):
    flow = Flow(tmp_path / "flow", {"bucket": _archive(tmp_path, "arch")})
    art = make_artifact(flow.runs / RUN, iteration=300)
    (art / "optim.pt").unlink()
    write_checkpoint_receipt(art, ReceiptDestination("s3", "s3.example.org", "ckpts", f"{RUN}/checkpoints/iter_000300"))
    assert json.loads((art / ".uploaded").read_text())["kind"] == "full-checkpoint"
    assert sorted(flow.planned("publish_all")) == ["publish", "publish_all", "publish_batch"]
    flow.ok("prune_all")
    receipt = json.loads((art / ".uploaded").read_text())
    assert "kind" not in receipt and receipt["destination"]["scheme"] == "file"
    assert sorted(walk_files(art)) == [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded", ".verified.json"]
    flow.nothing_planned("publish_all", "verify_all", "prune_all")


def test_two_working_directories_on_one_runs_root_never_delete_each_others_receipts(tmp_path):
    arch = _archive(tmp_path, "arch")
    a = Flow(tmp_path / "a", {"bucket": arch})
    b = Flow(tmp_path / "b", {"bucket": arch, "runs_root": str(a.runs)}, workflow=copy_workflow(tmp_path / "b-checkout"))
    for it in (300, 400):
        (make_artifact(a.runs / RUN, iteration=it, seed=it) / "optim.pt").unlink()
    # B plans both publications, then waits before its first receipt (one job at a time).
    flag = tmp_path / "b-paused"
    b.root.mkdir(parents=True)
    (b.root / "test-config.yaml").write_text(json.dumps(b.config), encoding="utf-8")
    env = {**os.environ, **b.env, "CKPTFLOW_TEST_PAUSE_AT": "publish:before-receipt", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)}
    proc = subprocess.Popen(
        [str(SNAKEMAKE), "-s", str(b.workflow / "Snakefile"), "-d", str(b.root), "--configfile",
         str(b.workflow / "config" / "config.yaml"), str(b.root / "test-config.yaml"), "--cores", "1", "publish_all"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        _wait(lambda: flag.exists() or proc.poll() is not None)
        assert flag.exists(), proc.communicate()[0]
        a.ok("prune_all")  # A publishes, verifies and prunes both meanwhile
        receipts = {it: (a.artifact(it) / ".uploaded").read_bytes() for it in (300, 400)}
        flag.unlink()
        # B goes on; each time it waits again, no receipt A wrote may be missing.
        while True:
            _wait(lambda: flag.exists() or proc.poll() is not None)
            for it in (300, 400):
                assert (a.artifact(it) / ".uploaded").is_file(), f"B deleted the receipt of iter {it}"
            if proc.poll() is not None:
                break
            flag.unlink()
        out = proc.communicate()[0]
        assert proc.returncode == 0, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for it in (300, 400):
        now = json.loads((a.artifact(it) / ".uploaded").read_text())
        assert {k: v for k, v in now.items() if k != "uploaded_at"} == {
            k: v for k, v in json.loads(receipts[it]).items() if k != "uploaded_at"}
    a.ok("verify_all", "prune_all")
    a.nothing_planned("publish_all", "verify_all", "prune_all")
    assert b.planned("publish_all") == []


def _wait(condition, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
