"""What materialize does with what it finds at --out: build, skip, rebuild, or refuse without touching it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from materialize_helpers import DEFAULTS, copy_tree, siblings

from ckptflow.conversion import CONVERSION_VERSION
from ckptflow.digest import FileDigest, sha256_file
from ckptflow.errors import Refused
from ckptflow.jsonio import validate
from ckptflow.materialize import materialize
from ckptflow.records import materialized as marker
from helpers.trees import tree_state


def build(models, out: Path, *, seed: int = 1, base: Path | None = None, **kw):
    options = {**DEFAULTS, **kw}
    return materialize(ckpt_dir=models.artifact("qwen3", seed), base=base or models.base("qwen3"), out=out, **options)


def test_build_publishes_a_verified_tree_whose_marker_names_every_shard(models, tmp_path):
    out = tmp_path / "teacher"
    result = build(models, out)
    report = result.to_report()
    validate(report, "report_materialize", what="materialize report")
    assert report["status"] == "built" and report["reason"] == "no previous output"
    record = marker.read_materialized(out)
    model_pt = models.artifact("qwen3", 1) / "model.pt"
    assert record.conversion_version == CONVERSION_VERSION == "materialize_model_pt_to_hf/3"
    assert (record.source.sha256, record.source.size, record.source.uri) == (
        sha256_file(model_pt).sha256, model_pt.stat().st_size, None)
    assert record.base.config_sha256 == sha256_file(models.base() / "config.json").sha256
    assert record.base.index_sha256 == sha256_file(models.base() / "model.safetensors.index.json").sha256
    assert dict(record.options) == {"max_shard_bytes": DEFAULTS["max_shard_bytes"]}
    assert len(record.shards) > 1
    for entry in record.shards:
        assert sha256_file(out / entry.path) == FileDigest(entry.size, entry.sha256)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert record.tensor_count == len(index["weight_map"]) == report["tensor_count"]
    assert report["verification"]["tensors_verified"] is True
    assert "bitwise_probe" in report["verification"]["checks"]
    assert siblings(out) == []  # no staged tree left beside it


def test_same_request_is_skipped_and_the_output_untouched(models, tmp_path):
    out = tmp_path / "teacher"
    build(models, out)
    before = tree_state(out)
    result = build(models, out)
    assert result.status == "skipped" and result.verification is None
    validate(result.to_report(), "report_materialize", what="materialize report")
    assert tree_state(out) == before
    assert siblings(out) == []


def test_skip_does_not_read_model_pt(models, tmp_path, monkeypatch):
    out = tmp_path / "teacher"
    build(models, out)

    def no_hashing(*args, **kwargs):
        raise AssertionError("a skip must not hash model.pt")

    monkeypatch.setattr("ckptflow.materialize.source.sha256_file", no_hashing)
    assert build(models, out).status == "skipped"


_SKIP_IN_A_FRESH_INTERPRETER = """
import json, sys
from ckptflow.materialize import materialize
result = materialize(ckpt_dir=sys.argv[1], base=sys.argv[2], out=sys.argv[3], **json.loads(sys.argv[4]))
print(json.dumps({"status": result.status, "loaded": [m for m in ("torch", "transformers") if m in sys.modules]}))
"""


def test_a_skip_loads_neither_torch_nor_transformers(models, tmp_path):
    """Deciding that a completed output is kept needs records only: a rerun that skips (a Snakemake job
    rerun after a code change, a second request) does not pay for loading torch."""
    out = tmp_path / "teacher"
    build(models, out)
    args = [str(models.artifact("qwen3", 1)), str(models.base("qwen3")), str(out), json.dumps(DEFAULTS)]
    child = subprocess.run([sys.executable, "-c", _SKIP_IN_A_FRESH_INTERPRETER, *args], capture_output=True,
                           text=True, timeout=120, check=False)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == {"status": "skipped", "loaded": []}


@pytest.mark.parametrize("change", ["source", "base", "options"])
def test_different_request_is_refused_naming_both_and_output_stays_byte_identical(models, tmp_path, change):
    out = tmp_path / "teacher"
    build(models, out)
    before = tree_state(out)
    kw: dict = {}
    if change == "source":
        kw["seed"] = 2
    elif change == "base":
        other = copy_tree(models.base(), tmp_path / "base2")
        config = json.loads((other / "config.json").read_text())
        (other / "config.json").write_text(json.dumps(config, indent=1))  # same model, other bytes
        kw["base"] = other
    else:
        kw["max_shard_bytes"] = 2 * DEFAULTS["max_shard_bytes"]
    with pytest.raises(Refused) as err:
        build(models, out, **kw)
    old = marker.read_materialized(out)
    message = str(err.value)
    assert str(out) in message and "--force" in message
    if change == "source":
        new_sha = sha256_file(models.artifact("qwen3", 2) / "model.pt").sha256
        assert old.source.sha256[:12] in message and new_sha[:12] in message and "source model.pt" in message
    elif change == "base":
        assert "base config.json" in message
    else:
        assert "option max_shard_bytes" in message
    assert tree_state(out) == before
    assert siblings(out) == []


def test_force_replaces_a_different_build_by_swap(models, tmp_path):
    out = tmp_path / "teacher"
    build(models, out)
    old = marker.read_materialized(out)
    result = build(models, out, seed=2, force=True)
    assert result.status == "built" and result.reason.startswith("forced: replaces a build that differs in source")
    assert result.to_report()["replaced_identity"]["source"]["sha256"] == old.source.sha256
    assert marker.read_materialized(out).source.sha256 == sha256_file(models.artifact("qwen3", 2) / "model.pt").sha256
    assert siblings(out) == []  # the previous tree is gone after the swap


def test_older_conversion_version_is_refused_unless_forced(models, tmp_path):
    out = tmp_path / "teacher"
    build(models, out)
    record = marker.read_materialized(out)
    marker.write_materialized(out, marker.Materialized(
        "materialize_model_pt_to_hf/2", record.source, record.base, record.options, record.shards, record.tensor_count))
    before = tree_state(out)
    with pytest.raises(Refused, match=r"conversion version materialize_model_pt_to_hf/2 -> materialize_model_pt_to_hf/3"):
        build(models, out)
    assert tree_state(out) == before
    result = build(models, out, force=True)
    assert result.status == "built"
    assert result.to_report()["replaced_identity"]["conversion_version"] == "materialize_model_pt_to_hf/2"
    assert marker.read_materialized(out).conversion_version == CONVERSION_VERSION


def test_a_marker_without_protocol_is_an_older_materializer(models, tmp_path):
    out = tmp_path / "teacher"
    build(models, out)
    data = json.loads(marker.path_in(out).read_text())
    del data["protocol"]
    marker.path_in(out).write_text(json.dumps(data))
    before = tree_state(out)
    with pytest.raises(Refused, match="older materializer"):
        build(models, out)
    assert tree_state(out) == before
    assert build(models, out, force=True).status == "built"


def test_unreadable_marker_is_refused_unless_forced(models, tmp_path):
    out = tmp_path / "teacher"
    build(models, out)
    marker.path_in(out).write_bytes(b"\xef\xbb\xbf{}")
    before = tree_state(out)
    with pytest.raises(Refused, match="cannot be read"):
        build(models, out)
    assert tree_state(out) == before
    assert build(models, out, force=True).reason == "forced: replaces an output with an unreadable marker"


@pytest.mark.parametrize("force", [False, True])
def test_foreign_directory_is_refused_even_with_force(models, tmp_path, force):
    out = tmp_path / "teacher"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "notes.txt").write_text("someone's work")
    before = tree_state(out)
    with pytest.raises(Refused, match="not built by ckptflow materialize"):
        build(models, out, force=force)
    assert tree_state(out) == before
    assert siblings(out) == []


def test_a_file_at_out_is_refused(models, tmp_path):
    out = tmp_path / "teacher"
    out.write_text("not a directory")
    with pytest.raises(Refused, match="not a directory"):
        build(models, out, force=True)
    assert out.read_text() == "not a directory"


def test_empty_output_directory_is_built_into(models, tmp_path):
    out = tmp_path / "teacher"
    out.mkdir()
    result = build(models, out)
    assert result.status == "built" and result.reason == "empty output directory"
    assert marker.read_materialized(out).tensor_count > 0


@pytest.mark.parametrize("damage", ["missing-shard", "resized-shard", "sidecar", "index"])
def test_damaged_output_of_the_same_request_is_rebuilt(models, tmp_path, damage):
    out = tmp_path / "teacher"
    build(models, out)
    shard = out / marker.read_materialized(out).shards[0].path
    if damage == "missing-shard":
        shard.unlink()
    elif damage == "resized-shard":
        with open(shard, "ab") as fh:
            fh.write(b"\0")
    elif damage == "sidecar":
        (out / "tokenizer_config.json").write_text("{}")
    else:
        (out / "model.safetensors.index.json").unlink()
    result = build(models, out)
    assert result.status == "built" and result.reason.startswith("rebuilt: ")
    assert build(models, out).status == "skipped"
    assert siblings(out) == []


def test_force_rebuilds_the_same_request(models, tmp_path):
    out = tmp_path / "teacher"
    build(models, out, verify_tensors=False)
    result = build(models, out, force=True)
    assert result.status == "built" and result.reason == "forced: rebuilds the same request"
    assert result.verification.tensors_verified is True
