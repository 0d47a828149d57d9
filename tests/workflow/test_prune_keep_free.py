"""``prune_all`` with ``prune: {keep_free, keep_newest}``: publishes and verifies every artifact, then frees the
oldest verified ones only until the runs root's file system (a real tmpfs) has the target free."""

from __future__ import annotations

import json
import shutil

import pytest
from workflow_helpers import RUN, Flow

from ckptflow.jsonio import validate
from helpers.artifacts import make_artifact
from helpers.disks import tmpfs_mounts

MiB = 1024 * 1024


@pytest.mark.slow
def test_prune_all_with_keep_free_frees_the_oldest_only_to_the_target_and_keeps_the_newest(tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    with tmpfs_mounts(tmp_path / "disks") as mount:
        runs = mount(64 * MiB) / "runs"
        arts = [make_artifact(runs / RUN, iteration=it, model_bytes=4 * MiB, seed=it) for it in (100, 200, 300)]
        for art in arts:
            (art / "optim.pt").unlink()  # an unselected file would (rightly) block pruning
        one = sum(p.stat().st_size for p in arts[0].rglob("*") if p.is_file() and not p.name.startswith("."))
        target = shutil.disk_usage(runs).free + one // 2  # the oldest artifact is enough
        flow = Flow(tmp_path / "wf", config={"runs_root": str(runs), "bucket": f"file://{archive}",
                                             "prune": {"keep_free": f"{target}B", "keep_newest": 1}})

        assert flow.planned("prune_all").count("prune_keep_free") == 1
        flow.ok("prune_all")

        report = json.loads((tmp_path / "wf" / "reports" / "prune" / "keep-free.json").read_text())
        validate(report, "report_prune_verified", what="keep-free report")
        assert [r["path"] for r in report["removed"]] == [str(arts[0])]
        assert report["keep_free"]["met"] and shutil.disk_usage(runs).free >= target
        assert not (arts[0] / "model.pt").exists()
        kept = {k["path"]: k["reason"] for k in report["kept"]}
        assert "not needed" in kept[str(arts[1])] and "newest" in kept[str(arts[2])]
        assert (arts[1] / "model.pt").exists() and (arts[2] / "model.pt").exists()
        assert not flow.report("prune", 100).exists()  # no per-artifact prune ran

        assert flow.planned("prune_all") == []  # nothing newly verified, the same options

        again = flow.ok("prune_all", "--forcerun", "prune_keep_free")  # the target holds: nothing more goes
        assert "prune_keep_free" in again and (arts[1] / "model.pt").exists()
        report = json.loads((tmp_path / "wf" / "reports" / "prune" / "keep-free.json").read_text())
        assert report["removed"] == [] and report["keep_free"]["met"]
