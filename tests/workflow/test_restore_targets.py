"""`snakemake restore --config iter=N run=R` and `restore_all`: pruned artifacts refilled in place; the
declared outputs are reports, so no Snakemake rerun or deletion ever touches the manifest or receipt."""

from __future__ import annotations

import json

import pytest
from workflow_helpers import RUN, Flow

from ckptflow.jsonio import validate
from helpers.artifacts import make_artifact
from helpers.trees import file_bytes

pytestmark = pytest.mark.slow

OTHER_RUN = "proj/grp/run2/20261130T000000Z"


def test_restore_one_iteration_then_every_pruned_artifact_of_a_run(tmp_path):
    (tmp_path / "archive").mkdir()
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{tmp_path / 'archive'}"})
    arts = {(RUN, 300): None, (RUN, 400): None, (OTHER_RUN, 300): None}
    for run, it in arts:
        art = make_artifact(flow.runs / run, iteration=it, seed=it + len(run))
        (art / "optim.pt").unlink()  # an unselected file would (rightly) block pruning
        arts[run, it] = file_bytes(art)
    flow.ok("prune_all")
    pruned = {key: file_bytes(flow.artifact(key[1], key[0])) for key in arts}
    assert all(sorted(files) == [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded", ".verified.json"] for files in pruned.values())
    # restored: the payloads as they were, beside the manifest and the receipt as prune left them
    arts = {key: {**files, **pruned[key]} for key, files in arts.items()}

    flow.ok("restore", iter=300, run=RUN)
    assert file_bytes(flow.artifact(300)) == arts[RUN, 300]
    report = json.loads(flow.report("restore", 300).read_text())
    validate(report, "report_restore", what="restore report")
    assert report["status"] == "restored" and report["downloaded_bytes"] == report["total_bytes"]
    assert flow.planned("restore", iter=300, run=RUN) == []
    assert file_bytes(flow.artifact(400)) == pruned[RUN, 400]  # only the iteration asked for

    assert flow.planned("restore_all", run=RUN) == ["restore_artifact", "restore_all"]
    flow.ok("restore_all", run=RUN)
    assert file_bytes(flow.artifact(400)) == arts[RUN, 400]
    assert file_bytes(flow.artifact(300, OTHER_RUN)) == pruned[OTHER_RUN, 300]  # another run: untouched
    assert flow.planned("restore_all", run=RUN) == []

    # Pruned again (outside the workflow), the earlier restore's report is older than the artifact: it reruns.
    for rel in ("model.pt",):
        (flow.artifact(300) / rel).unlink()
    assert flow.planned("restore", iter=300, run=RUN) == ["restore_artifact", "restore"]
    flow.ok("restore_all")  # every run
    assert all(file_bytes(flow.artifact(it, run)) == arts[run, it] for run, it in arts)
    assert flow.planned("restore_all") == []

    # One shard lost inside optim/ (the top directory unchanged): that directory's mtime reruns it.
    (flow.artifact(300) / "optim" / "__1_0.distcp").unlink()
    assert flow.planned("restore", iter=300, run=RUN) == ["restore_artifact", "restore"]
    flow.ok("restore", iter=300, run=RUN)
    assert file_bytes(flow.artifact(300)) == arts[RUN, 300]
    assert json.loads(flow.report("restore", 300).read_text())["downloaded"] == ["optim/__1_0.distcp"]


def test_the_workflows_restore_is_served_by_an_earlier_destination_when_the_receipts_current_one_is_gone(tmp_path):
    """Published by the workflow to A, then to B by hand (``publish --add-destination``, so the receipt names B
    first), pruned on both proofs; B's ``file://`` root then unmounted: ``restore`` is served by A, and its
    report names A and why B was skipped."""
    from helpers.cli import run_cli

    for name in ("A", "B"):
        (tmp_path / name).mkdir()
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{tmp_path / 'A'}"})
    art = make_artifact(flow.runs / RUN)
    (art / "optim.pt").unlink()
    flow.ok("publish_all")
    added = run_cli("publish", "--artifact-dir", str(art), "--bucket", f"file://{tmp_path / 'B'}", "--add-destination",
                    env=flow.env)
    assert added.returncode == 0, added.stderr[-2000:]
    whole = file_bytes(art)
    flow.ok("prune_all")
    assert not (art / "model.pt").exists()
    (tmp_path / "B").rename(tmp_path / "B.unmounted")

    flow.ok("restore", iter=300, run=RUN)
    restored = file_bytes(art)
    assert restored.pop(".verified.json")  # prune_all's verify recorded its check, as `ckptflow verify` does
    assert restored == whole
    report = json.loads(flow.report("restore", 300).read_text())
    validate(report, "report_restore", what="restore report")
    assert report["status"] == "restored" and report["destination"]["endpoint"] == str(tmp_path / "A")
    [skipped] = report["skipped_destinations"]
    assert skipped["destination"]["endpoint"] == str(tmp_path / "B") and "declaration" in skipped["detail"]
