"""The two inputs of a conversion: the consolidated ``model.pt`` and the Hugging Face base directory.

``model.pt`` is ``torch.save({"net": state_dict})``: bf16 tensors under Hugging Face key names, in the
transformers-v5 in-memory layout or the on-disk one. It is opened memory-mapped
(``torch.load(mmap=True, weights_only=True)``), so reading a tensor touches page cache, not anonymous memory,
and nothing in the file can run code.

The base is read without torch (torch is imported only to open a checkpoint): ``config.json`` (a JSON object), the index (or a lone
``model.safetensors``), every shard header checked against the index, and the sidecar list.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import InvalidRecord, NotFound
from . import shards, sidecars
from .dtypes import TensorInfo

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    tensors: dict[str, torch.Tensor]  # memory-mapped
    _mapped: list[tuple[int, int]] = field(default_factory=list, repr=False)

    def release(self, key: str) -> None:
        """Drop this process's resident pages of a consumed tensor (they stay in the page cache).

        A memory-mapped tensor that was read counts in the process's RSS until unmapped; on a Slurm node
        that accounts RSS, a large checkpoint read once would look like a large job. ``MADV_DONTNEED`` on a
        file mapping that is never written (torch maps it private) only forgets the pages: a later read
        faults them in again from the file. It is applied only to whole pages inside a mapping of this
        checkpoint's file (``/proc/self/maps``), never to anonymous memory.
        """
        if not self._mapped:
            return
        storage = self.tensors[key].untyped_storage()
        lo, hi = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
        page = mmap.PAGESIZE
        lo, hi = -(-lo // page) * page, hi // page * page
        if hi > lo and any(start <= lo and hi <= end for start, end in self._mapped):
            _madvise_dontneed(lo, hi - lo)

    def infos(self) -> dict[str, TensorInfo]:
        return {k: TensorInfo.of(v) for k, v in self.tensors.items()}

    @property
    def largest_tensor_bytes(self) -> int:
        return max((t.numel() * t.element_size() for t in self.tensors.values()), default=0)


def open_checkpoint(path: Path) -> Checkpoint:
    """Memory-map ``model.pt`` and validate its structure (``{"net": {str: Tensor}}``).

    ``path`` may be ``/proc/self/fd/N`` (a file the caller opened once): messages then name the file
    it was opened as."""
    import torch

    from .layout import dtype_name

    opened = Path(path)
    path = _display_path(opened)
    if not opened.is_file():
        raise NotFound(f"checkpoint {path} does not exist", path=str(path), remedy="check --ckpt-dir / the fetched artifact")
    try:
        obj = torch.load(opened, mmap=True, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a bad file; report it by name
        raise InvalidRecord(
            f"checkpoint {path} cannot be memory-mapped by torch.load(weights_only=True): {type(exc).__name__}: {exc}",
            path=str(path),
            remedy="re-save it with torch.save({'net': state_dict}) (zip format, tensors only)",
        ) from None
    if not isinstance(obj, dict) or "net" not in obj:
        found = sorted(obj)[:5] if isinstance(obj, dict) else type(obj).__name__
        raise InvalidRecord(f"checkpoint {path} is not {{'net': state_dict}} (found {found})", path=str(path),
                            remedy="save the consolidated model as torch.save({'net': state_dict})")
    net = obj["net"]
    if not isinstance(net, dict) or not net:
        raise InvalidRecord(f"checkpoint {path}: 'net' is not a non-empty dict", path=str(path),
                            remedy="save the consolidated model as torch.save({'net': state_dict})")
    for key, value in net.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise InvalidRecord(f"checkpoint {path}: entry {key!r} is a {type(value).__name__}, not a tensor",
                                path=str(path), remedy="'net' must map parameter names to tensors only")
        dtype_name(value.dtype)
    return Checkpoint(path, dict(net), _file_mappings(opened))


def _display_path(path: Path) -> Path:
    if path.parent == Path("/proc/self/fd"):
        try:
            return Path(os.readlink(path))
        except OSError:
            return path
    return path


def _file_mappings(path: Path) -> list[tuple[int, int]]:
    """Address ranges of this process mapped from ``path``'s file (empty where /proc is unavailable).

    Matched by device and inode, not by name: ``path`` may be ``/proc/self/fd/N`` (a file opened once
    whose name was since replaced or removed)."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    ranges = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(maxsplit=5)
                if len(parts) < 6 or parts[4] != str(st.st_ino):
                    continue
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                if (major, minor) == (os.major(st.st_dev), os.minor(st.st_dev)):
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    ranges.append((start, end))
    except (OSError, ValueError):
        return []
    return ranges


_MADV_DONTNEED = 4  # Linux


def _madvise_dontneed(addr: int, length: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(length), _MADV_DONTNEED)  # best effort: no error check


@dataclass(frozen=True)
class Base:
    path: Path
    config_bytes: bytes
    config: dict
    index: shards.Index
    headers: dict[str, shards.ShardHeader]
    sidecars: sidecars.Sidecars

    def infos(self) -> dict[str, TensorInfo]:
        """Every base tensor, ordered like the base (shard by shard, in data order)."""
        out: dict[str, TensorInfo] = {}
        for shard in sorted(self.headers):
            for key, entry in self.headers[shard].entries.items():
                out[key] = entry.info
        return out

    def has_experts(self) -> bool:
        return any(".experts." in k for k in self.index.weight_map)


def read_base(base_dir: Path) -> Base:
    """Read and validate the base directory (no torch, nothing written)."""
    base_dir = Path(base_dir)
    if not base_dir.is_dir():
        raise NotFound(f"base {base_dir} is not a directory", path=str(base_dir), remedy="point --base at a Hugging Face model directory")
    config_bytes, config = sidecars.read_config(base_dir)
    index = shards.read_index(base_dir, what="base")
    headers = shards.read_headers(base_dir, index)
    found = sidecars.list_sidecars(base_dir)
    for rel in found.files:
        sidecars.validate_sidecar(base_dir / rel, rel)
    return Base(base_dir, config_bytes, config, index, headers, found)
