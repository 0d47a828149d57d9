"""Merge methods behind a small registry: ``avg`` (uniform average) and ``tv`` (task-vector sum).

A method fills one output view from the matching expert (and base) views, chunk by chunk, so the
fp32 working set is a few MiB whatever the tensor's size. Chunking does not change a single bit: the
arithmetic is elementwise and keeps the oracle's order of operations, in fp32 (or wider, for wider
inputs), with one cast to the output dtype at the end:

* ``avg``: ``((e_1 + e_2 + ... + e_n) / n)``, summed left to right from ``e_1``;
* ``tv``:  ``base + lam * ((e_1 - base) + (e_2 - base) + ...)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

import torch

from .diagnostics import DeltaStats

CHUNK_NUMEL = 1 << 20  # elements per fp32 working chunk (4 MiB)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(torch.float32, dtype)


def chunks(out: torch.Tensor, inputs: list[torch.Tensor]) -> Iterator[tuple[torch.Tensor, list[torch.Tensor]]]:
    """Matching views of ``out`` and ``inputs`` (same shape) covering them in bounded pieces."""
    if out.is_contiguous() and all(t.is_contiguous() for t in inputs):
        flat_out, flat_in = out.view(-1), [t.view(-1) for t in inputs]
        n = flat_out.numel()
        for start in range(0, n, CHUNK_NUMEL):
            end = min(n, start + CHUNK_NUMEL)
            yield flat_out[start:end], [t[start:end] for t in flat_in]
        return
    if out.dim() == 0:
        yield out, inputs
        return
    rows = max(1, CHUNK_NUMEL // max(1, out[0].numel()))
    for start in range(0, out.shape[0], rows):
        yield out[start:start + rows], [t[start:start + rows] for t in inputs]


class Workspace:
    """Chunk-sized working buffers, allocated once per merge and reused for every chunk.

    Reusing them keeps the allocator out of the inner loop: multi-MiB temporaries malloc'd and freed
    per chunk make glibc raise its mmap threshold and keep freed memory in its heaps, which showed up
    as tens of MiB of extra anonymous memory on a 768 MiB merge.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get(self, name: str, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """A ``dtype`` view shaped like ``like`` (at most CHUNK_NUMEL elements), contents undefined."""
        key = (name, dtype)
        buf = self._buffers.get(key)
        if buf is None or buf.numel() < like.numel():
            buf = self._buffers[key] = torch.empty(max(CHUNK_NUMEL, like.numel()), dtype=dtype)
        return buf[: like.numel()].view(like.shape)

    def widen(self, name: str, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``x`` converted to ``dtype`` in buffer ``name``. ``copy_`` converts in place, whereas a
        mixed-dtype ``add_``/``sub_`` on CPU first allocates a converted temporary of its input."""
        return self.get(name, x, dtype).copy_(x)


class MergeMethod:
    name: ClassVar[str]
    needs_base: ClassVar[bool]

    def __init__(self) -> None:
        self.ws = Workspace()

    def merge(self, out: torch.Tensor, experts: list[torch.Tensor], base: torch.Tensor | None,
              stats: DeltaStats | None = None) -> None:
        raise NotImplementedError


class Average(MergeMethod):
    name = "avg"
    needs_base = False

    def merge(self, out, experts, base=None, stats=None):
        n = len(experts)
        ct = compute_dtype(out.dtype)
        for o, xs in chunks(out, experts):
            acc = self.ws.widen("acc", xs[0], ct)
            for x in xs[1:]:
                acc.add_(self.ws.widen("x", x, ct))  # both exact fp32 values; the sum rounds in fp32
            acc.div_(n)
            o.copy_(acc)  # the one rounding to the output dtype


class TaskVector(MergeMethod):
    name = "tv"
    needs_base = True

    def __init__(self, lam: float = 1.0):
        super().__init__()
        self.lam = float(lam)

    def merge(self, out, experts, base, stats=None):
        ct = compute_dtype(out.dtype)
        for o, xs in chunks(out, [*experts, base]):
            b = self.ws.widen("base", xs[-1], ct)
            if stats is not None:
                deltas = [self.ws.widen(f"delta{i}", x, ct).sub_(b) for i, x in enumerate(xs[:-1])]
                stats.update(deltas, b)
                acc = self.ws.widen("acc", deltas[0], ct)
                for d in deltas[1:]:
                    acc.add_(d)
            else:
                acc = self.ws.widen("acc", xs[0], ct).sub_(b)
                for x in xs[1:-1]:
                    acc.add_(self.ws.widen("x", x, ct).sub_(b))
            acc.mul_(self.lam)
            acc.add_(b)  # b + lam*S == lam*S + b: IEEE addition is commutative
            o.copy_(acc)


METHODS: dict[str, type[MergeMethod]] = {Average.name: Average, TaskVector.name: TaskVector}


def make_method(mode: str, lam: float | None) -> MergeMethod:
    if mode == TaskVector.name:
        return TaskVector(1.0 if lam is None else lam)
    return METHODS[mode]()
