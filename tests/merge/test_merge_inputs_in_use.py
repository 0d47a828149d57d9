"""A merge marks the expert artifacts it reads, so ``prune-verified --keep-free`` keeps them while it runs; an
expert removed anyway (``--paths`` prunes under a reader) fails the merge in one line naming it and the remedy.

Real processes: the merge paused after its first tensor is written (``merge:mid-model-write``), the prune run
beside it; the experts are published, verified artifacts of a run under a runs root, on a ``file://`` archive.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ckptflow.archive.probe import run_probe
from ckptflow.archive.publish import publish_artifact
from ckptflow.artifact import ComponentSpec, seal_artifact
from ckptflow.records import merge_record
from ckptflow.store.local import LocalStore
from helpers.artifacts import make_artifact
from helpers.cli import finish, run_cli, start_cli, wait_for_file

TS = "20261129T000000Z"
RUN = f"proj/group/experts/{TS}"


def _published_experts(moe, tmp_path: Path) -> tuple[Path, list[Path]]:
    """(runs root, the experts' artifact directories): each expert's model.pt sealed as iter_{100,200,300} of
    one run and published, with a newer committed iter_000900 (the newest of a run is never freed)."""
    store = LocalStore(tmp_path / "archive")
    store.root.mkdir()
    assert run_probe(store, "scratch").record.passed
    runs = tmp_path / "runs"
    arts = []
    for i, expert in enumerate(moe.paths()):
        art = runs / RUN / "checkpoint_artifacts" / f"iter_{(i + 1) * 100:06d}"
        art.mkdir(parents=True)
        shutil.copyfile(expert, art / "model.pt")
        seal_artifact(art, (i + 1) * 100, [ComponentSpec("model", "model.pt")], progress=False)
        publish_artifact(art, store, f"{RUN}/checkpoints", progress=False)
        arts.append(art)
    make_artifact(runs / RUN, iteration=900, model_bytes=1000, shards=1)
    return runs, arts


def _start_paused_merge(arts: list[Path], out: Path, flag: Path):
    experts = ",".join(str(a / "model.pt") for a in arts)
    merger = start_cli("merge", "--mode", "avg", "--experts", experts, "--out", str(out),
                       env={"CKPTFLOW_TEST_PAUSE_AT": "merge:mid-model-write", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    wait_for_file(flag, merger)
    return merger


@pytest.mark.slow
def test_keep_free_keeps_the_experts_a_merge_reads_naming_it(moe, tmp_path):
    runs, arts = _published_experts(moe, tmp_path)
    out, flag = tmp_path / "merged" / "checkpoint_artifacts" / "iter_000300" / "model.pt", tmp_path / "paused"
    merger = _start_paused_merge(arts, out, flag)
    try:
        proc = run_cli("prune-verified", "--runs-root", str(runs), "--keep-free", "100%")
        assert proc.returncode == 0, proc.stderr
        assert proc.report["removed"] == []
        reasons = {k["path"]: k["reason"] for k in proc.report["kept"]}
        for art in arts:
            assert f"being read in place by pid {merger.pid}" in reasons[str(art)], reasons
            assert (art / "model.pt").is_file()
        flag.unlink()
        stdout, stderr = finish(merger)
    finally:
        if merger.poll() is None:
            merger.kill()
            merger.wait()
    assert merger.returncode == 0 and json.loads(stdout)["status"] == "built", stderr
    assert not [p.name for p in arts[0].parent.iterdir() if p.name.endswith(".reading")]  # the marks went

    again = run_cli("prune-verified", "--runs-root", str(runs), "--keep-free", "100%")
    assert sorted(r["path"] for r in again.report["removed"]) == sorted(map(str, arts))


@pytest.mark.slow
def test_a_merge_whose_expert_is_removed_anyway_fails_in_one_line_naming_it_and_the_remedy(moe, tmp_path):
    _, arts = _published_experts(moe, tmp_path)
    out, flag = tmp_path / "merged" / "checkpoint_artifacts" / "iter_000300" / "model.pt", tmp_path / "paused"
    merger = _start_paused_merge(arts, out, flag)
    try:
        pruned = run_cli("prune-verified", "--paths", str(arts[1]))  # named paths go under a reader
        assert pruned.returncode == 0 and [r["path"] for r in pruned.report["removed"]] == [str(arts[1])], pruned.stderr
        flag.unlink()
        stdout, stderr = finish(merger)
    finally:
        if merger.poll() is None:
            merger.kill()
            merger.wait()
    assert merger.returncode == 1, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Errno" not in lines[0] and "Traceback" not in stderr, stderr
    assert f"expert {arts[1] / 'model.pt'} was removed while" in lines[0], lines
    assert f"ckptflow restore --artifact-dir {arts[1]}" in lines[0], lines
    assert json.loads(stdout)["status"] == "failed"
    assert not (out.parent / merge_record.FILENAME).exists() and not out.exists()


def test_a_merge_whose_expert_was_pruned_before_it_started_names_the_restore(moe, tmp_path):
    _, arts = _published_experts(moe, tmp_path)
    pruned = run_cli("prune-verified", "--paths", str(arts[1]))
    assert pruned.returncode == 0 and not (arts[1] / "model.pt").exists(), pruned.stderr
    out = tmp_path / "merged" / "checkpoint_artifacts" / "iter_000300" / "model.pt"
    proc = run_cli("merge", "--mode", "avg", "--experts", ",".join(str(a / "model.pt") for a in arts), "--out", str(out))
    assert proc.returncode == 1, proc.stderr
    line = proc.stderr.strip()
    assert line.count("\n") == 0 and f"expert {arts[1] / 'model.pt'} was pruned" in line, line
    assert f"ckptflow restore --artifact-dir {arts[1]}" in line and "check the --experts list" not in line, line
    assert not out.exists()
