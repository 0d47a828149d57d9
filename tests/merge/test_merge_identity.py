"""Request identity: skip the same request, rebuild damage, refuse a different or older one unless forced."""

from __future__ import annotations

import json

import pytest
from merge_helpers import assert_bits_equal, avg_oracle, load_net, tv_oracle

from ckptflow.artifact import ComponentSpec, seal_artifact
from ckptflow.digest import sha256_file
from ckptflow.errors import Refused
from ckptflow.jsonio import validate
from ckptflow.merge import merge_experts
from ckptflow.records import manifest as manifest_record
from ckptflow.records import merge_record
from helpers.cli import run_cli
from helpers.trees import file_bytes


def _record(out):
    return json.loads((out.parent / merge_record.FILENAME).read_text())


@pytest.mark.slow
def test_same_request_on_completed_output_is_skipped_without_touching_it(moe, out):
    experts = ",".join(map(str, moe.paths()))
    first = run_cli("merge", "--mode", "avg", "--experts", experts, "--out", str(out))
    assert first.returncode == 0, first.stderr
    before = file_bytes(out.parent)
    mtime = out.stat().st_mtime_ns
    again = run_cli("merge", "--mode", "avg", "--experts", experts, "--out", str(out))
    assert again.returncode == 0 and again.report["status"] == "skipped"
    assert again.report["request_identity"] == first.report["request_identity"]
    assert again.report["model"] == first.report["model"]
    assert file_bytes(out.parent) == before and out.stat().st_mtime_ns == mtime
    for report in (first.report, again.report):
        validate(report, "report_merge", what="merge report")


def test_commit_records_manifest_and_merge_record_describe_model_pt(moe, out):
    result = merge_experts("tv", moe.paths(), out, base=moe.base, lam=0.5, progress=False)
    manifest = manifest_record.read_manifest(out.parent)
    record = merge_record.read_merge_record(out.parent)
    model = manifest.components["model"]
    assert (model.path, model.size, model.sha256) == ("model.pt", result.model.size, result.model.sha256)
    assert manifest.iteration == 300 and record.request.iteration == 300
    assert [o.path for o in record.outputs] == ["model.pt"]
    assert record.request.identity() == result.identity
    assert [(e.path, e.size, e.sha256) for e in record.request.experts] == [
        (str(p), sha256_file(p).size, sha256_file(p).sha256) for p in moe.paths()
    ]
    assert record.request.base is not None and record.request.lam == 0.5


def test_expert_order_is_part_of_the_identity_and_a_reorder_is_refused_naming_both(moe, out):
    first = merge_experts("avg", moe.paths(), out, progress=False)
    before = file_bytes(out.parent)
    reordered = list(reversed(moe.paths()))
    with pytest.raises(Refused) as err:
        merge_experts("avg", reordered, out, progress=False)
    message = str(err.value)
    assert first.identity[:12] in message and "expert order" in message and "--force" in message
    assert file_bytes(out.parent) == before
    forced = merge_experts("avg", reordered, out, force=True, progress=False)
    assert forced.status == "built" and forced.replaced_identity == first.identity
    assert forced.identity != first.identity and forced.identity[:12] in message
    assert _record(out)["request"]["experts"][0]["path"] == str(reordered[0])


def test_a_different_mode_is_refused_and_force_replaces_it(moe, out):
    merge_experts("avg", moe.paths(), out, progress=False)
    with pytest.raises(Refused, match="mode avg -> tv"):
        merge_experts("tv", moe.paths(), out, base=moe.base, progress=False)
    merge_experts("tv", moe.paths(), out, base=moe.base, force=True, progress=False)
    assert_bits_equal(load_net(out), tv_oracle(moe.base_mem, moe.mem, 1.0))


def test_damaged_model_pt_is_rebuilt(moe, out):
    merge_experts("avg", moe.paths(), out, progress=False)
    data = bytearray(out.read_bytes())
    data[len(data) // 2] ^= 0xFF
    out.write_bytes(bytes(data))
    result = merge_experts("avg", moe.paths(), out, progress=False)
    assert result.status == "built" and "bytes differ" in result.reason
    assert_bits_equal(load_net(out), avg_oracle(moe.mem))


@pytest.mark.parametrize("lost", [merge_record.FILENAME, "model.pt"])
def test_incomplete_output_is_rebuilt(moe, out, lost):
    merge_experts("avg", moe.paths(), out, progress=False)
    (out.parent / lost).unlink()
    result = merge_experts("avg", moe.paths(), out, progress=False)
    assert result.status == "built"
    assert merge_record.read_merge_record(out.parent).request.identity() == result.identity


def test_record_without_protocol_from_the_retired_tool_is_refused_unless_forced(moe, out):
    out.parent.mkdir(parents=True)
    out.write_bytes(b"written by merge_model_pt.py")
    legacy = {"mode": "avg", "experts": [str(p) for p in moe.paths()], "out": str(out)}
    (out.parent / merge_record.FILENAME).write_text(json.dumps(legacy))
    before = file_bytes(out.parent)
    with pytest.raises(Refused, match="older merge tool"):
        merge_experts("avg", moe.paths(), out, progress=False)
    assert file_bytes(out.parent) == before
    assert merge_experts("avg", moe.paths(), out, force=True, progress=False).status == "built"
    assert _record(out)["protocol"] == merge_record.PROTOCOL


def test_record_of_another_tool_version_is_refused_unless_forced(moe, out):
    merge_experts("avg", moe.paths(), out, progress=False)
    record = _record(out)
    record["tool_version"] = "0.0.1"
    (out.parent / merge_record.FILENAME).write_text(json.dumps(record))
    with pytest.raises(Refused, match=r"ckptflow 0\.0\.1"):
        merge_experts("avg", moe.paths(), out, progress=False)
    assert merge_experts("avg", moe.paths(), out, force=True, progress=False).status == "built"


def test_an_artifact_committed_by_another_producer_is_not_replaced_without_force(moe, out):
    out.parent.mkdir(parents=True)
    out.write_bytes(b"a trainer's model")
    seal_artifact(out.parent, 300, [ComponentSpec("model", "model.pt")], progress=False)
    before = file_bytes(out.parent)
    with pytest.raises(Refused, match="ckptflow seal"):
        merge_experts("avg", moe.paths(), out, progress=False)
    assert file_bytes(out.parent) == before


def test_a_published_artifact_is_never_rebuilt_even_with_force(moe, out):
    merge_experts("avg", moe.paths(), out, progress=False)
    (out.parent / ".uploaded").write_text("{}")
    out.unlink()  # e.g. released by prune-verified after publication
    before = file_bytes(out.parent)
    with pytest.raises(Refused, match="published"):
        merge_experts("avg", moe.paths(), out, force=True, progress=False)
    assert file_bytes(out.parent) == before


def test_diagnostics_asked_for_later_rebuild_and_a_replaced_diag_is_removed(moe, out):
    merge_experts("tv", moe.paths(), out, base=moe.base, progress=False)
    diag = out.parent / "merge_diag.json"
    result = merge_experts("tv", moe.paths(), out, base=moe.base, diag=diag, progress=False)
    assert result.status == "built" and diag.is_file()
    assert _record(out)["diag"] == "merge_diag.json"
    assert merge_experts("tv", moe.paths(), out, base=moe.base, diag=diag, progress=False).status == "skipped"
    moved = out.parent / "diag2.json"
    merge_experts("tv", moe.paths(), out, base=moe.base, diag=moved, progress=False)
    assert moved.is_file() and not diag.exists()
