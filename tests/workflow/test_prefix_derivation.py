"""One derivation of where an artifact is archived, whatever the depth of runs_root: the CLI, the trainer
and the workflow publish the same tree under the same keys (``archive.keys``), and the workflow's other
steps (materialize_teacher's source) expect the prefix that derivation gives. Real Snakemake, the real
CLI, ``file://`` archives."""

from __future__ import annotations

import json

import pytest
from workflow_helpers import Flow

from ckptflow.records import receipt as receipt_record
from ckptflow.store.local import LocalStore
from ckptflow.trainer.publish import trainer_publish
from ckptflow.workflow.triggers import teacher_source
from helpers.artifacts import make_artifact
from helpers.cli import run_cli

# runs_root is one level above <project>: the workflow's run wildcard is team/proj/grp/run1/<ts>.
RUN = "team/proj/grp/run1/20261129T000000Z"
PREFIX = "proj/grp/run1/20261129T000000Z/checkpoint_artifacts/iter_000300"


def _archive(root):
    archive = root / "archive"
    archive.mkdir(parents=True)
    return archive


def _keys(archive) -> list[str]:
    return sorted(o.key for o in LocalStore(archive).list(""))


@pytest.mark.slow
def test_the_cli_the_trainer_and_the_workflow_archive_one_tree_under_the_same_keys(tmp_path):
    cli_art = make_artifact(tmp_path / "cli" / "runs" / RUN)
    cli_archive = _archive(tmp_path / "cli")
    proc = run_cli("publish", "--artifact-dir", str(cli_art), "--bucket", f"file://{cli_archive}")
    assert proc.returncode == 0, proc.stderr

    trainer_art = make_artifact(tmp_path / "trainer" / "runs" / RUN)
    trainer_archive = _archive(tmp_path / "trainer")
    outcome = trainer_publish(trainer_art, LocalStore(trainer_archive), None)
    assert outcome.ok, outcome.error

    flow = Flow(tmp_path / "flow")
    flow_archive = _archive(tmp_path / "flow")
    flow.config["bucket"] = f"file://{flow_archive}"
    flow_art = make_artifact(flow.runs / RUN)
    flow.ok("publish_all")

    keys = _keys(cli_archive)
    assert keys and all(k.startswith(PREFIX + "/") for k in keys), keys
    assert _keys(trainer_archive) == keys and _keys(flow_archive) == keys
    for art in (cli_art, trainer_art, flow_art):
        assert receipt_record.read_receipt(art).destination.prefix == PREFIX
    assert json.loads(flow.report("publish", run=RUN).read_text())["destination"]["prefix"] == PREFIX

    # The CLI publishing what publish_all published finds its own receipt: skipped, not refused.
    again = run_cli("publish", "--artifact-dir", str(flow_art), "--bucket", f"file://{flow_archive}")
    assert again.returncode == 0 and again.report["status"] == "skipped", again.stderr


def test_materialize_teacher_expects_the_derived_prefix_of_the_artifacts_receipt(tmp_path):
    runs = tmp_path / "runs"
    art = make_artifact(runs / RUN)
    archive = _archive(tmp_path)
    proc = run_cli("publish", "--artifact-dir", str(art), "--bucket", f"file://{archive}")
    assert proc.returncode == 0, proc.stderr
    (art / "model.pt").unlink()  # as a prune leaves it: the receipt names the archive
    source = teacher_source(art, RUN, bucket=f"file://{archive}", has_recipe=False)
    assert source.kind == "archive" and source.uri == f"file://{archive}/{PREFIX}"
    # Without a local directory, the archive is looked for under the same derived prefix.
    missing = runs / RUN / "checkpoint_artifacts" / "iter_000400"
    fetched = teacher_source(missing, RUN, bucket=f"file://{archive}", has_recipe=False)
    assert fetched.uri == f"file://{archive}/{PREFIX.replace('iter_000300', 'iter_000400')}"
