"""The staged build: sources checked before use, verification, --no-verify, failures that keep the old output."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from materialize_helpers import DEFAULTS, copy_tree, siblings

from ckptflow.errors import NotFound, Refused, UsageError, VerificationFailed
from ckptflow.materialize import materialize
from ckptflow.records import manifest as manifest_record
from ckptflow.records import materialized as marker
from helpers import tiny_models as tm
from helpers.trees import tree_bytes, tree_state


def build(models, out, *, kind="qwen3", seed=1, ckpt_dir=None, **kw):
    options = {**DEFAULTS, **kw}
    return materialize(ckpt_dir=ckpt_dir or models.artifact(kind, seed), base=models.base(kind), out=out, **options)


def test_moe_output_loads_completely_with_transformers(models, tmp_path):
    out = tmp_path / "teacher"
    result = build(models, out, kind="qwen3_moe")
    assert result.status == "built" and "expert_layout" in result.verification.checks
    assert result.verification.probed_experts
    with tm.quiet_transformers():
        model, info = tm.auto_class("qwen3_moe").from_pretrained(out, output_loading_info=True, dtype=torch.bfloat16)
    assert {name: sorted(v) for name, v in info.items() if v} == {}
    direct = tm.load_direct("qwen3_moe", models.base("qwen3_moe"), models.state_dict("qwen3_moe", 1))
    ids = tm.sample_input_ids()
    with torch.no_grad(), tm.quiet_transformers():
        assert torch.equal(model.eval()(input_ids=ids).logits, direct(input_ids=ids).logits)


def test_no_verify_skips_only_tensor_probes_and_the_skip_stays_idempotent(models, tmp_path):
    out = tmp_path / "teacher"
    result = build(models, out, verify_tensors=False)
    summary = result.verification
    assert summary.tensors_verified is False and summary.probed == ()
    assert summary.checks == ("tensor_count", "index_headers", "key_coverage", "config_identity", "sidecar_identity",
                              "loaders")  # the transformers loaders run under --no-verify too
    # Verifying needs --force or another --out; a plain rerun (with or without --no-verify) skips.
    assert build(models, out).status == "skipped"
    assert build(models, out, verify_tensors=False).status == "skipped"


def test_no_verify_still_refuses_a_bad_index(models, tmp_path, monkeypatch):
    from ckptflow.conversion import shards

    real = shards.write_index

    def wrong_total(directory, weight_map, total_size):
        return real(directory, weight_map, total_size + 1)

    monkeypatch.setattr(shards, "write_index", wrong_total)
    out = tmp_path / "teacher"
    with pytest.raises(VerificationFailed, match="total_size"):
        build(models, out, verify_tensors=False)
    assert not out.exists() and siblings(out) == []


def test_failure_before_the_swap_keeps_the_old_output_byte_identical(models, tmp_path, monkeypatch):
    out = tmp_path / "teacher"
    build(models, out)
    before = tree_state(out)

    def failing_verify(*args, **kwargs):
        raise VerificationFailed("probe differs (injected)")

    monkeypatch.setattr("ckptflow.conversion.verify.verify_output", failing_verify)  # imported on use
    with pytest.raises(VerificationFailed, match="injected"):
        build(models, out, seed=2, force=True)
    assert tree_state(out) == before
    assert siblings(out) == []


def test_tensor_floor_refuses_before_anything_is_written(models, tmp_path):
    out = tmp_path / "teacher"
    with pytest.raises(Refused, match=r"fewer than the floor of 800 \(--min-tensors\)"):
        build(models, out, min_tensors=800)
    with pytest.raises(Refused, match="--expect-tensors says 7"):
        build(models, out, expect_tensors=7)
    assert not out.exists() and siblings(out) == []


def test_expect_tensors_exact_count_builds(models, tmp_path):
    count = len(json.loads((models.base() / "model.safetensors.index.json").read_text())["weight_map"])
    out = tmp_path / "teacher"
    assert build(models, out, expect_tensors=count, min_tensors=count).record.tensor_count == count


def test_local_model_pt_not_matching_its_manifest_is_refused_before_writing(models, tmp_path):
    art = copy_tree(models.artifact(), tmp_path / "checkpoint_artifacts" / "iter_000300")
    data = bytearray((art / "model.pt").read_bytes())
    data[-100] ^= 0xFF  # same size, other bytes
    (art / "model.pt").write_bytes(bytes(data))
    out = tmp_path / "teacher"
    with pytest.raises(VerificationFailed, match="its manifest records"):
        build(models, out, ckpt_dir=art)
    assert not out.exists() and siblings(out) == []


def test_manifest_without_digest_hashes_the_file_for_the_same_identity(models, tmp_path):
    out = tmp_path / "teacher"
    build(models, out)
    art = copy_tree(models.artifact(), tmp_path / "checkpoint_artifacts" / "iter_000300")
    manifest = manifest_record.read_manifest(art)
    model = manifest.components["model"]
    manifest_record.path_in(art).unlink()
    manifest_record.write_manifest(art, manifest_record.Manifest(
        manifest.iteration, {"model": manifest_record.FileComponent(model.path, model.size)}))
    result = build(models, out, ckpt_dir=art)
    assert result.status == "skipped" and result.source.identity.sha256 == model.sha256


def test_pruned_artifact_names_the_archive_as_remedy(models, tmp_path):
    art = copy_tree(models.artifact(), tmp_path / "checkpoint_artifacts" / "iter_000300")
    (art / "model.pt").unlink()
    with pytest.raises(NotFound, match="--artifact-uri"):
        build(models, tmp_path / "teacher", ckpt_dir=art)


def test_uncommitted_artifact_is_not_a_source(models, tmp_path):
    art = copy_tree(models.artifact(), tmp_path / "checkpoint_artifacts" / "iter_000300")
    manifest_record.path_in(art).unlink()
    with pytest.raises(NotFound, match="not a committed artifact"):
        build(models, tmp_path / "teacher", ckpt_dir=art)


@pytest.mark.parametrize("kw", [
    {"artifact_uri": "file:///nowhere/iter_000300"},  # two sources
    {"stage_dir": "<out>/stage"},  # the stage of a --ckpt-dir (read through it once pruned) inside the output
    {"max_shard_bytes": 0},
    {"min_tensors": -1},
])
def test_inconsistent_arguments_are_usage_errors(models, tmp_path, kw):
    out = tmp_path / "teacher"
    kw = {k: str(out / "stage") if v == "<out>/stage" else v for k, v in kw.items()}
    with pytest.raises(UsageError):
        build(models, out, **kw)


def test_output_inside_the_base_is_a_usage_error(models, tmp_path):
    with pytest.raises(UsageError, match="overlap"):
        build(models, models.base() / "teacher")
    assert not (models.base() / "teacher").exists()


def test_marker_is_inside_the_tree_before_it_is_published(models, tmp_path, monkeypatch):
    import ckptflow.materialize.output as mo

    seen = []
    real = mo.swap_into_place

    def spy(tmp, out, wanted, **kw):
        seen.append(marker.read_materialized(tmp))
        assert not out.exists()
        return real(tmp, out, wanted, **kw)

    monkeypatch.setattr("ckptflow.materialize.build.swap_into_place", spy)
    out = tmp_path / "teacher"
    build(models, out)
    assert seen == [marker.read_materialized(out)]


def test_single_file_base_is_identified_by_its_header(models, tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    from ckptflow.digest import sha256_bytes

    base = copy_tree(models.base(), tmp_path / "base1")
    index = json.loads((base / "model.safetensors.index.json").read_text())
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(base / shard), framework="pt") as f:
            tensors.update({k: f.get_tensor(k) for k in f.keys()})
        (base / shard).unlink()
    (base / "model.safetensors.index.json").unlink()
    save_file(tensors, str(base / "model.safetensors"), metadata={"format": "pt"})
    raw = (base / "model.safetensors").read_bytes()
    header = raw[: 8 + int.from_bytes(raw[:8], "little")]

    out = tmp_path / "teacher"
    result = materialize(ckpt_dir=models.artifact(), base=base, out=out, **DEFAULTS)
    assert result.status == "built"
    assert marker.read_materialized(out).base.index_sha256 == sha256_bytes(header)
    assert materialize(ckpt_dir=models.artifact(), base=base, out=out, **DEFAULTS).status == "skipped"


@pytest.mark.parametrize(("stage", "target"), [("overlay", "hf.convert_checkpoint"), ("verify", "verify.verify_output"),
                                              ("verify", "verify.check_loaders")])
def test_a_failure_names_its_stage_and_keeps_the_old_output_under_force_no_verify(models, tmp_path, monkeypatch,
                                                                                  stage, target):
    out = tmp_path / "teacher"
    build(models, out)
    before = tree_bytes(out)

    def failing(*args, **kwargs):
        raise VerificationFailed(f"{target} failed (injected)")

    monkeypatch.setattr(f"ckptflow.conversion.{target}", failing)  # the conversion is imported on first use
    with pytest.raises(VerificationFailed, match=rf"materialize {stage} stage failed for {out}: {target} failed"):
        build(models, out, seed=2, force=True, verify_tensors=False)
    assert tree_bytes(out) == before
    assert siblings(out) == []


def test_the_transformers_loaders_run_on_the_staged_build_before_it_is_published(models, tmp_path):
    base = copy_tree(models.base("qwen2_5_vl"), tmp_path / "base")
    out = tmp_path / "teacher"
    result = materialize(ckpt_dir=models.artifact("qwen2_5_vl"), base=base, out=out, **DEFAULTS)
    loaders = result.verification.loaders
    assert loaders["AutoTokenizer"] == loaders["GenerationConfig"] == loaders["AutoImageProcessor"] == "ok"
    assert loaders["AutoProcessor"] == ("ok" if importlib.util.find_spec("torchvision") else
                                        "skipped: torchvision is not installed (Qwen-VL processors import it)")
    assert result.verification.checks[-1] == "loaders"
    before = tree_bytes(out)
    (base / "tokenizer.json").write_text("{}")  # a JSON object (the preflight passes) no tokenizer loads
    with pytest.raises(VerificationFailed, match=rf"materialize verify stage failed for {out}: "
                                                 r"AutoTokenizer\.from_pretrained cannot load .*teacher\.tmp\."):
        materialize(ckpt_dir=models.artifact("qwen2_5_vl"), base=base, out=out, force=True, verify_tensors=False,
                    **DEFAULTS)
    assert tree_bytes(out) == before and siblings(out) == []
