"""Tensor shapes and safetensors dtype names without torch: what the base's headers are read with.

``ITEMSIZE`` maps every safetensors dtype name ckptflow converts to its element size in bytes;
``layout.DTYPES`` maps the same names to torch dtypes (a test keeps the two in step). ``TensorInfo`` lives
here so that reading and validating a base (``source.read_base``, the materialize preflight) never
imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

ITEMSIZE: dict[str, int] = {
    "BF16": 2, "F16": 2, "F32": 4, "F64": 8,
    "I8": 1, "I16": 2, "I32": 4, "I64": 8,
    "U8": 1, "U16": 2, "U32": 4, "U64": 8,
    "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1,
}


@dataclass(frozen=True)
class TensorInfo:
    """Shape and safetensors dtype name of one tensor; ``dtype=None`` means "any" (a target without a dtype)."""

    shape: tuple[int, ...]
    dtype: str | None

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @classmethod
    def of(cls, tensor: torch.Tensor) -> TensorInfo:
        from .layout import dtype_name

        return cls(tuple(tensor.shape), dtype_name(tensor.dtype))
