"""Crash states left by real killed processes, and what the next request does with each (recovery.py)."""

from __future__ import annotations

import pytest
from materialize_helpers import DEFAULTS, cli_args, cli_env, siblings

from ckptflow.digest import sha256_file
from ckptflow.errors import Refused
from ckptflow.materialize import materialize
from ckptflow.records import materialized as marker
from helpers.cli import run_cli
from helpers.trees import tree_bytes


def request(models, out, *, seed: int = 1, **kw):
    return materialize(ckpt_dir=models.artifact("qwen3", seed), base=models.base(), out=out, **{**DEFAULTS, **kw})


def killed(models, out, point: str, *more: str, seed: int = 1) -> None:
    proc = run_cli(*cli_args(models.artifact("qwen3", seed), models.base(), out, *more),
                   env=cli_env(CKPTFLOW_TEST_KILL_AT=f"materialize:{point}"))
    assert proc.returncode == -9, proc.stderr


def only(out, kind: str):
    [path] = [out.parent / n for n in siblings(out) if n.startswith(f"{out.name}.{kind}.")]
    return path


def sha_of(models, seed: int) -> str:
    return sha256_file(models.artifact("qwen3", seed) / "model.pt").sha256


@pytest.mark.slow
def test_recovery_resyncs_sidecars_and_config_then_publishes_under_no_verify(models, tmp_path):
    out = tmp_path / "teacher"
    killed(models, out, "after-marker")
    left = only(out, "tmp")
    (left / "tokenizer_config.json").write_text("{}")  # a sidecar the base does not have in this form
    (left / "config.json").unlink()  # and a missing config.json
    shards = {e.path: (left / e.path).read_bytes() for e in marker.read_materialized(left).shards}
    result = request(models, out, verify_tensors=False)
    assert result.status == "built" and result.recovered == str(left)
    assert result.verification.tensors_verified is False  # trusted on size and tensor count
    for name in ("tokenizer_config.json", "config.json"):
        assert (out / name).read_bytes() == (models.base() / name).read_bytes()
    assert {p: (out / p).read_bytes() for p in shards} == shards  # never a shard rewritten
    assert siblings(out) == []


@pytest.mark.slow
def test_a_failed_recovery_check_refuses_by_name_and_keeps_the_tree_until_force_completes_out(models, tmp_path):
    out = tmp_path / "teacher"
    killed(models, out, "after-marker")
    left = only(out, "tmp")
    record = marker.read_materialized(left)
    shard = left / record.shards[0].path
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    shard.write_bytes(bytes(data))
    kept = tree_bytes(left)
    proc = run_cli(*cli_args(models.artifact("qwen3", 1), models.base(), out))  # its pid is gone afterwards
    assert proc.returncode == 1 and proc.report["status"] == "refused", proc.stderr
    assert "recovery check" in proc.stderr and str(left) in proc.stderr and "absent" in proc.stderr
    assert not out.exists()
    assert [tree_bytes(out.parent / n) for n in siblings(out)] == [kept]  # shards and marker untouched

    # --force builds afresh; a killed --force run never touches the kept tree, the only complete one.
    killed(models, out, "after-convert", "--force")
    assert [tree_bytes(out.parent / n) for n in siblings(out) if tree_bytes(out.parent / n) == kept] == [kept]
    result = request(models, out, force=True)
    assert result.status == "built" and result.recovered is None
    assert marker.read_materialized(out).source.sha256 == sha_of(models, 1)
    assert siblings(out) == []  # discarded only once <out> was complete again


@pytest.mark.slow
def test_a_leftover_previous_beside_a_complete_out_is_left_by_a_skip_refused_by_a_build_and_goes_at_a_forced_swap(
        models, tmp_path):
    out = tmp_path / "teacher"
    request(models, out, seed=1)
    killed(models, out, "after-swap", "--force", seed=2)
    aside = only(out, "previous")
    kept = tree_bytes(aside)
    assert request(models, out, seed=2).status == "skipped"
    assert tree_bytes(aside) == kept
    (out / "tokenizer_config.json").write_text("{}")  # damaged: the same request would rebuild
    before = tree_bytes(out)
    with pytest.raises(Refused, match="previous output a killed materialize left") as err:
        request(models, out, seed=2)
    assert str(aside) in str(err.value) and "--force" in err.value.remedy
    assert tree_bytes(out) == before and tree_bytes(aside) == kept
    result = request(models, out, seed=2, force=True)
    assert result.status == "built" and str(aside) in result.removed_leftovers
    assert siblings(out) == []


@pytest.mark.slow
def test_a_previous_without_out_is_renamed_back_first_under_force_too(models, tmp_path):
    out = tmp_path / "teacher"
    request(models, out, seed=1)
    old = tree_bytes(out)
    killed(models, out, "mid-swap", "--force", seed=2)
    assert not out.exists()
    aside = only(out, "previous")
    assert tree_bytes(aside) == old
    killed(models, out, "after-convert", "--force", seed=2)  # renamed back before this run built anything
    assert tree_bytes(out) == old
    result = request(models, out, seed=2, force=True)
    assert result.status == "built" and marker.read_materialized(out).source.sha256 == sha_of(models, 2)
    assert siblings(out) == []


@pytest.mark.slow
def test_recovery_replaces_the_template_directory_whole_from_a_staged_copy(models, tmp_path):
    kind = "qwen2_5_vl"
    base, out = models.base(kind), tmp_path / "teacher"
    proc = run_cli(*cli_args(models.artifact(kind), base, out),
                   env=cli_env(CKPTFLOW_TEST_KILL_AT="materialize:after-marker"))
    assert proc.returncode == -9, proc.stderr
    left = only(out, "tmp")
    templates = left / "additional_chat_templates"
    (templates / "tool_use.jinja").write_text("{{ changed }}")
    (templates / "stray.jinja").write_text("{{ not the base's }}")  # a copy file by file would keep it
    inode = templates.stat().st_ino
    result = materialize(ckpt_dir=models.artifact(kind), base=base, out=out, **DEFAULTS)
    assert result.status == "built" and result.recovered == str(left)
    assert tree_bytes(out / "additional_chat_templates") == tree_bytes(base / "additional_chat_templates")
    assert (out / "additional_chat_templates").stat().st_ino != inode  # a new directory, renamed in
    assert [n for n in tree_bytes(out) if n.startswith(".additional_chat_templates")] == []
    assert siblings(out) == []
