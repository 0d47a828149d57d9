"""An incremental writer for ``torch.save``'s zip format: tensors are written as they are produced.

``torch.save(obj)`` pickles the whole object first, so every output tensor must be alive at once. Here
each tensor's bytes become a storage record (``data/<key>``) the moment it is added and can be freed
right after; the pickle (``data.pkl``), which only *refers* to storage keys, is written last. Readers
find records through the zip's central directory, so the order does not matter to ``torch.load``,
including ``torch.load(mmap=True, weights_only=True)``. The pickle uses the same rebuild function,
storage classes and protocol as ``torch.save`` (``torch._utils._rebuild_tensor_v2``, ``torch.<T>Storage``,
protocol 2) and ``torch._C.PyTorchFileWriter`` with torch's own crc32 and alignment settings.

A tensor added under a second name (``add_alias``) shares the first one's storage, as tied weights do
in a ``state_dict`` saved by ``torch.save``.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import serialization

from ..digest import HashingWriter
from ..errors import InvalidRecord

PICKLE_PROTOCOL = 2  # torch.serialization.DEFAULT_PROTOCOL


@dataclass(frozen=True, slots=True)
class _StorageRef:
    key: str
    dtype: torch.dtype
    numel: int


class _TensorStub:
    """Pickles exactly like a contiguous CPU tensor whose bytes live in storage record ``ref``."""

    __slots__ = ("ref", "shape", "stride")

    def __init__(self, ref: _StorageRef, shape: tuple[int, ...], stride: tuple[int, ...]):
        self.ref, self.shape, self.stride = ref, shape, stride

    def __reduce_ex__(self, protocol: int):
        return (torch._utils._rebuild_tensor_v2, (self.ref, 0, self.shape, self.stride, False, OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any):
        if isinstance(obj, _StorageRef):
            return ("storage", _storage_class(obj.dtype), obj.key, "cpu", obj.numel)
        return None


def _storage_class(dtype: torch.dtype) -> type:
    name = torch.storage._dtype_to_storage_type_map().get(dtype)
    if name is None:
        raise InvalidRecord(f"dtype {dtype} cannot be written in torch.save's v2 tensor format")
    return getattr(torch, name)


class TorchSaveWriter:
    """Write ``{wrap_key: {name: tensor, ...}}`` to ``path`` one tensor at a time.

    The file is created exclusively. ``finish`` writes the pickle and the end of the archive, fsyncs,
    and sets ``size`` and ``sha256`` (of every byte written); a writer closed without ``finish``
    leaves an unreadable file, which is the caller's temporary to remove.
    """

    def __init__(self, path: Path | str):
        self.path = Path(path)
        # A Python file object (not a path) makes the archive's folder name "archive", as torch.save
        # to a file object does, instead of one derived from our temporary's name; every byte passes
        # through ``digest.HashingWriter`` so the digest costs no second read.
        self._fh = open(self.path, "xb")  # closed in close()
        self._hashing = HashingWriter(self._fh)
        crc, align = serialization.get_crc32_options(), serialization._get_storage_alignment()
        self._zip = torch._C.PyTorchFileWriter(self._hashing, crc, align)
        self._entries: dict[str, _TensorStub] = {}
        self._storages = 0
        self.bytes_written = 0
        self.size: int | None = None
        self.sha256: str | None = None

    def add(self, name: str, tensor: torch.Tensor) -> None:
        """Write ``tensor``'s bytes now; the caller may free or reuse the tensor afterwards."""
        if name in self._entries:
            raise ValueError(f"tensor {name!r} added twice")
        if tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.storage_offset() != 0:
            raise ValueError(f"tensor {name!r} must be a contiguous CPU tensor at the start of its storage")
        ref = _StorageRef(key=str(self._storages), dtype=tensor.dtype, numel=tensor.numel())
        _storage_class(tensor.dtype)
        nbytes = tensor.numel() * tensor.element_size()
        # The storage may be larger than the tensor (a reused buffer): only its first nbytes are written,
        # straight from the tensor's memory, without a copy.
        self._zip.write_record(f"data/{ref.key}", tensor.untyped_storage(), nbytes)
        self._storages += 1
        self.bytes_written += nbytes
        self._entries[name] = _TensorStub(ref, tuple(tensor.shape), tuple(tensor.stride()))

    def add_alias(self, name: str, existing: str) -> None:
        """``name`` is the same tensor as ``existing`` (tied weights): one storage, two keys."""
        if name in self._entries:
            raise ValueError(f"tensor {name!r} added twice")
        self._entries[name] = self._entries[existing]

    def names(self) -> list[str]:
        return list(self._entries)

    def finish(self, wrap_key: str | None = "net") -> None:
        """Write the pickle (referring to the storages written so far) and close the archive."""
        state = dict(self._entries)
        obj: Any = {wrap_key: state} if wrap_key is not None else state
        buf = io.BytesIO()
        _Pickler(buf, protocol=PICKLE_PROTOCOL).dump(obj)
        data = buf.getvalue()
        self._zip.write_record("data.pkl", data, len(data))
        self._zip.write_record(".format_version", "1", 1)
        align = str(serialization._get_storage_alignment())
        self._zip.write_record(".storage_alignment", align, len(align))
        self._zip.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        self._zip.write_end_of_file()
        self._zip = None
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.size, self.sha256 = self._hashing.size, self._hashing.hexdigest()
        self.close()

    def close(self) -> None:
        self._zip = None
        if not self._fh.closed:
            self._fh.close()

    def __enter__(self) -> TorchSaveWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
