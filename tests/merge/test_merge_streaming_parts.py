"""The streaming parts on their own: the incremental writer is torch.save's format, chunking is exact."""

from __future__ import annotations

import zipfile

import pytest
import torch
from merge_helpers import bits_equal

from ckptflow.merge import methods
from ckptflow.merge.diagnostics import DeltaStats
from ckptflow.merge.writer import TorchSaveWriter


def _state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    embed = torch.randn(16, 8, generator=gen).to(torch.bfloat16)
    return {
        "model.embed_tokens.weight": embed,
        "model.norm.weight": torch.randn(8, generator=gen).to(torch.bfloat16),
        "scalar": torch.tensor(1.5),
        "empty": torch.empty(0, 4, dtype=torch.bfloat16),
        "lm_head.weight": embed,  # tied: shares the embedding's storage
    }


def test_writer_pickle_is_byte_identical_to_torch_save(tmp_path):
    state = _state()
    torch.save({"net": state}, tmp_path / "ref.pt")
    writer = TorchSaveWriter(tmp_path / "mine.pt")
    for name, tensor in state.items():
        if name == "lm_head.weight":
            writer.add_alias(name, "model.embed_tokens.weight")
        else:
            writer.add(name, tensor)
    writer.finish()
    ref, mine = zipfile.ZipFile(tmp_path / "ref.pt"), zipfile.ZipFile(tmp_path / "mine.pt")
    assert ref.read("ref/data.pkl") == mine.read("archive/data.pkl")
    loaded = torch.load(tmp_path / "mine.pt", map_location="cpu", mmap=True, weights_only=True)["net"]
    assert all(bits_equal(loaded[k], v) for k, v in state.items())
    assert loaded["lm_head.weight"].data_ptr() == loaded["model.embed_tokens.weight"].data_ptr()


def test_writer_digest_is_the_digest_of_the_file(tmp_path):
    from ckptflow.digest import sha256_file

    writer = TorchSaveWriter(tmp_path / "m.pt")
    writer.add("x", torch.arange(10, dtype=torch.bfloat16))
    writer.finish()
    digest = sha256_file(tmp_path / "m.pt")
    assert (digest.size, digest.sha256) == (writer.size, writer.sha256)


def test_writer_never_replaces_an_existing_file(tmp_path):
    (tmp_path / "m.pt").write_bytes(b"keep")
    with pytest.raises(FileExistsError):
        TorchSaveWriter(tmp_path / "m.pt")
    assert (tmp_path / "m.pt").read_bytes() == b"keep"


@pytest.mark.parametrize("transposed", [False, True])
def test_chunking_and_strided_inputs_do_not_change_a_bit(monkeypatch, transposed):
    monkeypatch.setattr(methods, "CHUNK_NUMEL", 1000)  # many chunks, the last one partial
    gen = torch.Generator().manual_seed(1)
    xs = [(torch.randn(301, 37, generator=gen) * s).to(torch.bfloat16) for s in (1.0, 3.0, 0.01)]
    xs[0][0, :2], xs[1][0, :2], xs[2][0, :2] = -0.0, -0.0, -0.0  # the sign of zero survives
    base = torch.randn(301, 37, generator=gen).to(torch.bfloat16)
    if transposed:
        xs = [x.t().contiguous().t() for x in xs]
        assert not xs[0].is_contiguous()
    out = torch.empty(301, 37, dtype=torch.bfloat16)
    methods.Average().merge(out, xs)
    assert bits_equal(out, ((xs[0].float() + xs[1].float() + xs[2].float()) / 3).to(torch.bfloat16))
    b = base.float()
    stats = DeltaStats(3)
    methods.TaskVector(0.3).merge(out, xs, base, stats)
    want = (b + 0.3 * ((xs[0].float() - b) + (xs[1].float() - b) + (xs[2].float() - b))).to(torch.bfloat16)
    assert bits_equal(out, want)
    assert stats.max_abs[1] == float((xs[1].float() - b).abs().max())
