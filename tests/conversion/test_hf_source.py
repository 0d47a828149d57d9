"""The memory-mapped checkpoint: pages of consumed tensors are dropped, values stay readable from the file."""

from __future__ import annotations

import os

import torch

from ckptflow.conversion.source import open_checkpoint
from helpers import tiny_models as tm


def test_checkpoint_is_memory_mapped_and_release_keeps_values(tiny, tmp_path):
    state = tiny.state_dict("qwen3_moe")
    ckpt = open_checkpoint(tm.save_consolidated(state, tmp_path / "model.pt"))
    assert ckpt._mapped, "torch.load(mmap=True) maps the file; /proc/self/maps shows it"
    for key, tensor in ckpt.tensors.items():
        lo = tensor.untyped_storage().data_ptr()
        assert any(start <= lo < end for start, end in ckpt._mapped), key
    before = {k: v.clone() for k, v in ckpt.tensors.items()}
    for key in ckpt.tensors:
        ckpt.release(key)
    for key, tensor in ckpt.tensors.items():
        assert torch.equal(tensor.view(torch.uint8), before[key].view(torch.uint8)), key
        assert torch.equal(tensor.view(torch.uint8), state[key].contiguous().view(torch.uint8)), key


def test_release_forgets_resident_pages(tmp_path):
    big = torch.arange(32 << 20, dtype=torch.int32).to(torch.bfloat16)  # 64 MiB
    ckpt = open_checkpoint(tm.save_consolidated({"w": big}, tmp_path / "model.pt"))

    def rss_file() -> int:
        with open(f"/proc/{os.getpid()}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("RssFile:")) * 1024

    assert ckpt.tensors["w"].float().sum().item() == big.float().sum().item()  # touch every page
    touched = rss_file()
    ckpt.release("w")
    assert touched - rss_file() >= 60 << 20
    assert torch.equal(ckpt.tensors["w"], big)  # faulted in again from the file
