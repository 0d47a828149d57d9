"""Merge only replaces a model.pt it can prove it wrote, and never an input reached under another spelling."""

from __future__ import annotations

import os
import shutil
import signal

import pytest
from merge_helpers import assert_bits_equal, avg_oracle, load_net

from ckptflow.errors import Refused
from ckptflow.merge import merge_experts
from ckptflow.records import merge_record
from helpers.cli import run_cli
from helpers.trees import file_bytes


def _avg(experts, out, *extra, env=None):
    return run_cli("merge", "--mode", "avg", "--experts", ",".join(map(str, experts)), "--out", str(out), *extra,
                   env=env)


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.slow
def test_a_record_less_model_pt_the_merge_did_not_write_is_refused_by_name(moe, out, force):
    out.parent.mkdir(parents=True)
    out.write_bytes(b"the user's own unsealed model, the only copy")
    before = file_bytes(out.parent)
    result = _avg(moe.paths(), out, *(["--force"] if force else []))
    assert result.returncode == 1 and result.report["status"] == "refused", result.stderr
    assert str(out) in result.stderr and "seal" in result.stderr and "move" in result.stderr
    assert file_bytes(out.parent) == before


def test_a_model_pt_replaced_by_the_user_after_a_killed_merge_is_not_overwritten(moe, out):
    killed = _avg(moe.paths(), out, env={"CKPTFLOW_TEST_KILL_AT": "merge:after-model-rename"})
    assert killed.returncode == -signal.SIGKILL
    out.unlink()
    out.write_bytes(b"written by hand after the killed merge")
    before = file_bytes(out.parent)
    with pytest.raises(Refused, match="proves that ckptflow merge wrote it"):
        merge_experts("avg", moe.paths(), out, progress=False)
    assert file_bytes(out.parent) == before


@pytest.mark.parametrize("point", ["merge:after-record-removed", "merge:after-model-rename", "merge:after-manifest"])
@pytest.mark.slow
def test_the_in_progress_marker_lets_the_same_command_finish_a_killed_merge(moe, out, point):
    assert _avg(moe.paths(), out).returncode == 0
    changed = [*moe.paths()[:2]]
    assert _avg(changed, out, "--force", env={"CKPTFLOW_TEST_KILL_AT": point}).returncode == -signal.SIGKILL
    assert not merge_record.path_in(out.parent).exists() and out.exists()
    rerun = _avg(changed, out)
    assert rerun.returncode == 0 and rerun.report["status"] == "built", rerun.stderr
    assert_bits_equal(load_net(out), avg_oracle(moe.mem[:2]))
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(
        [".merge-complete.json", ".posttrain-checkpoint-artifact.json", "model.pt"])


@pytest.mark.parametrize("link", ["symlinked directory", "hard link"])
@pytest.mark.slow
def test_an_expert_that_is_the_output_under_another_spelling_is_refused(moe, tmp_path, link):
    real = tmp_path / "ex" / "iter_7" / "model.pt"
    real.parent.mkdir(parents=True)
    shutil.copy(moe.mem_paths[0], real)
    if link == "symlinked directory":
        (tmp_path / "exlink").symlink_to(tmp_path / "ex")
        expert = tmp_path / "exlink" / "iter_7" / "model.pt"
    else:
        expert = tmp_path / "elsewhere.pt"
        os.link(real, expert)
    before = real.read_bytes()
    result = _avg([expert, *moe.mem_paths[1:]], real)
    assert result.returncode == 2 and result.report["status"] == "usage-error", result.stderr
    assert "is the output itself" in result.stderr and str(expert) in result.stderr
    assert real.read_bytes() == before
    assert sorted(p.name for p in real.parent.iterdir()) == ["model.pt"]
