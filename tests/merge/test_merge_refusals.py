"""Bad requests are refused by name before anything is written."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from ckptflow.errors import InvalidRecord, Refused, UsageError, VerificationFailed
from ckptflow.merge import merge_experts, run
from helpers.cli import run_cli
from helpers.tiny_models import save_consolidated
from helpers.trees import file_bytes


def _variant(tmp_path, sd, name, edit):
    sd = dict(sd)
    edit(sd)
    return save_consolidated(sd, tmp_path / name / "model.pt")


def test_mismatched_key_sets_are_refused_naming_the_keys(moe, out, tmp_path):
    dropped = "model.layers.1.self_attn.q_norm.weight"
    odd = _variant(tmp_path, moe.mem[1], "odd", lambda sd: sd.pop(dropped))
    with pytest.raises(Refused) as err:
        merge_experts("avg", [moe.mem_paths[0], odd], out, progress=False)
    assert dropped in str(err.value) and str(odd) in str(err.value)
    assert not out.parent.exists()


def test_mismatched_shapes_are_refused_naming_the_tensor(moe, out, tmp_path):
    key = "model.norm.weight"
    odd = _variant(tmp_path, moe.mem[1], "odd", lambda sd: sd.__setitem__(key, torch.zeros(65, dtype=torch.bfloat16)))
    with pytest.raises(Refused, match=key):
        merge_experts("avg", [moe.mem_paths[0], odd], out, progress=False)


def test_a_base_of_another_architecture_is_refused(moe, dense, out):
    with pytest.raises(Refused, match="lacks"):
        merge_experts("tv", moe.paths(), out, base=dense.base, progress=False)


def test_an_expert_that_is_not_a_net_checkpoint_is_refused_by_name(moe, out, tmp_path):
    bare = tmp_path / "bare.pt"
    torch.save(moe.mem[0], bare)
    with pytest.raises(InvalidRecord, match="'net'"):
        merge_experts("avg", [moe.mem_paths[0], bare], out, progress=False)


@pytest.mark.parametrize("bad_out", ["run/iter_000300/merged.pt", "run/step_300/model.pt"])
def test_out_must_be_iter_dir_model_pt(moe, tmp_path, bad_out):
    with pytest.raises(UsageError):
        merge_experts("avg", moe.paths(), tmp_path / bad_out, progress=False)


def test_explicit_iteration_must_match_the_directory(moe, out):
    with pytest.raises(Refused, match="iter_000300"):
        merge_experts("avg", moe.paths(), out, iteration=301, progress=False)
    merge_experts("avg", moe.paths(), out, iteration=300, progress=False)


@pytest.mark.parametrize(
    ("mode", "extra", "message"),
    [
        ("tv", {}, "needs --base"),
        ("avg", {"base": "somewhere"}, "--base applies to --mode tv only"),
        ("avg", {"lam": 0.5}, "--lam applies to --mode tv only"),
    ],
)
def test_inconsistent_flags_are_usage_errors(moe, out, mode, extra, message):
    with pytest.raises(UsageError, match=message):
        merge_experts(mode, moe.paths(), out, progress=False, **extra)


def test_refused_request_leaves_existing_output_byte_identical(moe, out, tmp_path):
    merge_experts("avg", moe.paths(), out, progress=False)
    before = file_bytes(out.parent)
    odd = _variant(tmp_path, moe.mem[1], "odd", lambda sd: sd.pop("model.norm.weight"))
    with pytest.raises(Refused):
        merge_experts("avg", [moe.mem_paths[0], odd], out, force=True, progress=False)
    assert file_bytes(out.parent) == before


@pytest.mark.slow
def test_cli_usage_error_exits_2_and_refusal_exits_1(moe, out):
    experts = ",".join(map(str, moe.paths()))
    usage = run_cli("merge", "--mode", "tv", "--experts", experts, "--out", str(out))
    assert usage.returncode == 2 and usage.report["status"] == "usage-error"
    refused = run_cli("merge", "--mode", "avg", "--experts", experts, "--out", str(out), "--iteration", "7")
    assert refused.returncode == 1 and refused.report["status"] == "refused"
    assert "iter_000300" in refused.stderr and refused.stderr.count("\n") == 1


def test_an_expert_rewritten_during_the_merge_fails_and_commits_nothing(moe, out, tmp_path, monkeypatch):
    moving = tmp_path / "moving.pt"
    shutil.copy(moe.mem_paths[1], moving)
    real = run.write_merged

    def write_then_touch(*args, **kwargs):
        result = real(*args, **kwargs)
        st = moving.stat()
        os.utime(moving, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a writer touched it meanwhile
        return result

    monkeypatch.setattr(run, "write_merged", write_then_touch)
    with pytest.raises(VerificationFailed, match=r"moving\.pt"):
        merge_experts("avg", [moe.mem_paths[0], moving], out, progress=False)
    assert sorted(p.name for p in out.parent.iterdir()) == []
