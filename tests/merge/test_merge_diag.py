"""--diag: per tensor and expert, the delta's L2 norm, its norm relative to the base, max |delta|, and
the cosine between experts' deltas; recorded in .merge-complete.json when it lies in the artifact."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ckptflow.merge import merge_experts
from ckptflow.records import merge_record
from helpers.tiny_models import save_consolidated


def _expected(base: torch.Tensor, experts: list[torch.Tensor]) -> dict:
    b = base.double()
    deltas = [e.float().double() - b for e in experts]
    norms = [float(d.norm()) for d in deltas]
    return {
        "base_norm": float(b.norm()),
        "delta_norm": norms,
        "max_abs_delta": [float((e.float() - base.float()).abs().max()) for e in experts],
        "cosine": [[float((di * dj).sum()) / (ni * nj) for dj, nj in zip(deltas, norms, strict=True)]
                   for di, ni in zip(deltas, norms, strict=True)],
    }


def test_diag_lists_every_tensor_with_delta_statistics_per_expert(moe, out):
    diag = out.parent / "merge_diag.json"
    merge_experts("tv", moe.paths(), out, base=moe.base, lam=0.5, diag=diag, progress=False)
    doc = json.loads(diag.read_text())
    assert doc["format"] == "ckptflow.merge-diag.v1" and doc["mode"] == "tv" and doc["lam"] == 0.5
    assert doc["experts"] == [str(p) for p in moe.paths()]
    assert list(doc["tensors"]) == list(moe.mem[0])
    for name, entry in doc["tensors"].items():
        want = _expected(moe.base_mem[name], [sd[name] for sd in moe.mem])
        assert entry["shape"] == list(moe.mem[0][name].shape)
        assert entry["base_norm"] == pytest.approx(want["base_norm"], rel=1e-4)
        for i, stats in enumerate(entry["experts"]):
            assert stats["delta_norm"] == pytest.approx(want["delta_norm"][i], rel=1e-4)
            assert stats["relative_norm"] == pytest.approx(want["delta_norm"][i] / want["base_norm"], rel=1e-4)
            assert stats["max_abs_delta"] == want["max_abs_delta"][i]  # exact: one fp32 subtraction
        cosine = entry["cosine"]
        assert cosine == [list(row) for row in zip(*cosine, strict=True)]  # symmetric
        for i, row in enumerate(cosine):
            assert row == pytest.approx(want["cosine"][i], abs=1e-4)
    total = doc["summary"]
    assert len(total["experts"]) == 3 and all(math.isclose(total["cosine"][i][i], 1.0) for i in range(3))


def test_diag_inside_the_artifact_is_an_output_of_the_record(moe, out):
    diag = out.parent / "reports" / "diag.json"
    merge_experts("tv", moe.paths(), out, base=moe.base, diag=diag, progress=False)
    record = merge_record.read_merge_record(out.parent)
    assert record.diag == "reports/diag.json"
    assert {o.path for o in record.outputs} == {"model.pt", "reports/diag.json"}


def test_diag_outside_the_artifact_is_written_but_not_recorded(moe, out, tmp_path):
    diag = tmp_path / "elsewhere" / "diag.json"
    result = merge_experts("tv", moe.paths(), out, base=moe.base, diag=diag, progress=False)
    assert json.loads(diag.read_text())["format"] == "ckptflow.merge-diag.v1"
    assert result.diag == diag and merge_record.read_merge_record(out.parent).diag is None


def test_an_undefined_statistic_is_null_not_nan(dense, out):
    # tv of the base itself: every delta is zero, so relative norms are 0 and cosines undefined.
    same = save_consolidated(dense.base_mem, out.parent.parent / "same" / "model.pt")
    diag = out.parent / "d.json"
    merge_experts("tv", [same, same], out, base=dense.base, diag=diag, progress=False)
    text = diag.read_text()
    assert "NaN" not in text and "Infinity" not in text
    entry = json.loads(text)["tensors"]["model.norm.weight"]
    assert entry["experts"][0]["delta_norm"] == 0.0 and entry["cosine"][0][1] is None
