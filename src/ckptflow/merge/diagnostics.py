"""Per-tensor task-vector diagnostics, accumulated chunk by chunk while the merge streams.

For every output tensor and every expert ``i`` with delta ``d_i = expert_i - base`` (fp32):
``delta_norm`` (L2 of ``d_i``), ``relative_norm`` (``|d_i| / |base|``), ``max_abs_delta`` and the
cosine between every two experts' deltas (a K x K matrix). The same figures over the whole model are
in ``summary``. A value that is undefined (a zero norm) or not finite is ``null``: the file is strict
JSON. Format::

    {"format": "ckptflow.merge-diag.v1", "mode": "tv", "lam": 1.0, "experts": ["/a/model.pt", ...],
     "summary": {"base_norm": ..., "experts": [{"delta_norm", "relative_norm", "max_abs_delta"}, ...],
                 "cosine": [[1.0, 0.12], [0.12, 1.0]]},
     "tensors": {"model.layers.0.mlp.gate_proj.weight": {"shape": [...], "base_norm": ...,
                 "experts": [...], "cosine": [[...]]}, ...}}
"""

from __future__ import annotations

import math
from typing import Any

import torch

FORMAT = "ckptflow.merge-diag.v1"


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a.reshape(-1), b.reshape(-1)))


class DeltaStats:
    """Sums of squares, pairwise dot products and max |delta| for K experts over any number of chunks."""

    def __init__(self, k: int):
        self.k = k
        self.base_sq = 0.0
        self.dots = [[0.0] * k for _ in range(k)]  # dots[i][i] is |d_i|^2
        self.max_abs = [0.0] * k

    def update(self, deltas: list[torch.Tensor], base: torch.Tensor) -> None:
        self.base_sq += _dot(base, base)
        for i, di in enumerate(deltas):
            for j in range(i, self.k):
                self.dots[i][j] += _dot(di, deltas[j])
            if di.numel():
                self.max_abs[i] = max(self.max_abs[i], float(torch.linalg.vector_norm(di, ord=math.inf)))

    def add(self, other: DeltaStats) -> None:
        self.base_sq += other.base_sq
        for i in range(self.k):
            for j in range(i, self.k):
                self.dots[i][j] += other.dots[i][j]
            self.max_abs[i] = max(self.max_abs[i], other.max_abs[i])

    def to_dict(self) -> dict[str, Any]:
        base_norm = math.sqrt(self.base_sq) if self.base_sq >= 0 else math.nan
        norms = [math.sqrt(max(self.dots[i][i], 0.0)) for i in range(self.k)]
        experts = [
            {
                "delta_norm": _finite(norms[i]),
                "relative_norm": _finite(norms[i] / base_norm) if base_norm > 0 else None,
                "max_abs_delta": _finite(self.max_abs[i]),
            }
            for i in range(self.k)
        ]
        cosine: list[list[float | None]] = [[None] * self.k for _ in range(self.k)]
        for i in range(self.k):
            for j in range(i, self.k):
                denom = norms[i] * norms[j]
                value = _finite(self.dots[i][j] / denom) if denom > 0 else None
                cosine[i][j] = cosine[j][i] = None if value is None else max(-1.0, min(1.0, value))
        return {"base_norm": _finite(base_norm), "experts": experts, "cosine": cosine}


class Diagnostics:
    """The whole diagnostics document; ``tensor(name)`` starts a tensor's accumulator."""

    def __init__(self, mode: str, lam: float | None, experts: list[str]):
        self.mode, self.lam, self.experts = mode, lam, experts
        self.total = DeltaStats(len(experts))
        self.tensors: dict[str, dict[str, Any]] = {}

    def begin(self) -> DeltaStats:
        return DeltaStats(len(self.experts))

    def end(self, name: str, shape: tuple[int, ...], stats: DeltaStats) -> None:
        self.total.add(stats)
        self.tensors[name] = {"shape": list(shape), **stats.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "mode": self.mode,
            "lam": self.lam,
            "experts": list(self.experts),
            "summary": self.total.to_dict(),
            "tensors": self.tensors,
        }
