"""Read merge inputs without copying them into memory.

Experts are consolidated ``torch.save({"net": state_dict})`` files, opened with
``torch.load(mmap=True, weights_only=True)``: tensors are views of the file's pages, so reading them
costs page cache, not anonymous memory. The base is a Hugging Face directory of safetensors shards
(``model.safetensors.index.json``'s ``weight_map``, or a single ``model.safetensors``); each shard's
header is validated (JSON object, known dtypes, shapes matching byte ranges, ranges inside the file,
``size == 8 + header + data``) and its tensors are views of a private (copy-on-write) memory map.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import pickle
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..conversion.layout import DTYPES, TensorInfo
from ..digest import sha256_bytes, sha256_file
from ..errors import InvalidRecord, NotFound
from ..fsutil import safe_relpath

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER = 100 * 1024 * 1024

class PageReleaser:
    """Drop the pages of consumed tensors from this process's private, read-only file mapping.

    After a tensor was merged its pages are still mapped, so RSS (not anonymous RSS) would grow to the
    size of every input. ``madvise(MADV_DONTNEED)`` on a private file mapping whose pages were never
    written unmaps them; a later read faults them in again from the page cache, bytes unchanged. Only
    whole pages inside the mapping of ``path`` (found in ``/proc/self/maps``) are released, never
    anonymous memory; where that cannot be established (not Linux) this does nothing.
    """

    MADV_DONTNEED = 4

    def __init__(self, path: Path, probe: torch.Tensor | None):
        self.range: tuple[int, int] | None = None
        if probe is None or not sys.platform.startswith("linux") or probe.numel() == 0:
            return
        address, real = probe.data_ptr(), os.path.realpath(path)
        try:
            with open("/proc/self/maps") as fh:
                for line in fh:
                    fields = line.split(maxsplit=5)
                    lo, hi = (int(x, 16) for x in fields[0].split("-"))
                    if lo <= address < hi and len(fields) == 6 and fields[5].strip() == real and fields[1][3] == "p":
                        self.range = (lo, hi)
                        break
        except OSError:
            return
        if self.range is not None:
            self._madvise = ctypes.CDLL(None, use_errno=True).madvise
            self._madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)

    def release(self, tensor: torch.Tensor) -> None:
        if self.range is None or tensor.numel() == 0:
            return
        start = tensor.data_ptr()
        # Contiguous row ranges, or a transposed expert's columns: [start, end) then lies inside its tensor
        # (a page released early is read again from the page cache, bytes unchanged).
        end = start + tensor.numel() * tensor.element_size()
        page = mmap.PAGESIZE
        lo, hi = max(self.range[0], -(-start // page) * page), min(self.range[1], end // page * page)
        if hi > lo:
            self._madvise(lo, hi - lo, self.MADV_DONTNEED)


@dataclass
class ExpertCheckpoint:
    """One expert: its path (as given) and the state dict of mmap'd tensors."""

    path: Path
    tensors: dict[str, torch.Tensor]
    pages: PageReleaser | None = None

    def info(self) -> dict[str, TensorInfo]:
        return {k: TensorInfo.of(t) for k, t in self.tensors.items()}

    def tensor(self, key: str) -> torch.Tensor:
        return self.tensors[key]


def open_expert(path: Path) -> ExpertCheckpoint:
    """Memory-map ``{"net": state_dict}`` from ``path``; refuse anything else by name."""
    remedy = 'experts must be written with torch.save({"net": state_dict}) (zip format, CPU tensors)'
    try:
        obj = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    except FileNotFoundError:
        raise NotFound(f"expert {path} does not exist", remedy="check the --experts list") from None
    except (RuntimeError, ValueError, OSError, EOFError, pickle.UnpicklingError) as exc:
        raise InvalidRecord(f"expert {path} cannot be opened as a checkpoint: {exc}", remedy=remedy) from None
    if not isinstance(obj, Mapping) or "net" not in obj:
        found = sorted(map(str, obj))[:5] if isinstance(obj, Mapping) else type(obj).__name__
        raise InvalidRecord(f"expert {path} has no top-level 'net' entry (found {found})", remedy=remedy)
    net = obj["net"]
    if not isinstance(net, Mapping) or not net:
        raise InvalidRecord(f"expert {path}: 'net' is not a non-empty state dict", remedy=remedy)
    tensors: dict[str, torch.Tensor] = {}
    for key, value in net.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise InvalidRecord(f"expert {path}: entry {key!r} of 'net' is not a named tensor", remedy=remedy)
        if value.layout != torch.strided or not value.is_floating_point():
            raise InvalidRecord(
                f"expert {path}: tensor {key} is {value.dtype} ({value.layout}); only dense floating tensors merge",
                remedy="remove buffers that are not weights from the state dict",
            )
        tensors[key] = value
    probe = next((t for t in tensors.values() if t.numel()), None)
    return ExpertCheckpoint(path=path, tensors=tensors, pages=PageReleaser(path, probe))


@dataclass
class SafetensorsShard:
    path: Path
    header: dict[str, dict[str, Any]]
    header_bytes: bytes
    data_start: int
    _mmap: mmap.mmap | None = field(default=None, repr=False)
    pages: PageReleaser | None = field(default=None, repr=False)

    def tensor(self, key: str) -> torch.Tensor:
        entry = self.header[key]
        dtype, shape = DTYPES[entry["dtype"]], tuple(entry["shape"])
        begin, end = entry["data_offsets"]
        if end == begin:
            return torch.empty(shape, dtype=dtype)
        if self._mmap is None:
            with open(self.path, "rb") as fh:
                # ACCESS_COPY: writable for torch.frombuffer, private, file-backed until written (never is).
                self._mmap = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        raw = torch.frombuffer(self._mmap, dtype=torch.uint8, count=end - begin, offset=self.data_start + begin)
        if self.pages is None:
            self.pages = PageReleaser(self.path, raw)
        return raw.view(dtype).reshape(shape)


def read_safetensors_header(path: Path) -> SafetensorsShard:
    """Parse and check one shard's header; the tensors stay on disk."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise InvalidRecord(f"safetensors shard {path} is shorter than its 8-byte header length")
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER or 8 + n > size:
                raise InvalidRecord(f"safetensors shard {path} declares a {n}-byte header in a {size}-byte file")
            raw = fh.read(n)
    except FileNotFoundError:
        raise NotFound(f"base shard {path} does not exist", remedy="the base index names a missing shard") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRecord(f"safetensors shard {path} has an unreadable header: {exc}") from None
    if not isinstance(header, dict):
        raise InvalidRecord(f"safetensors shard {path}: header is not a JSON object")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    end_max = 0
    for key, entry in header.items():
        where = f"safetensors shard {path}: tensor {key}"
        ok = (
            isinstance(entry, dict)
            and entry.get("dtype") in DTYPES
            and isinstance(entry.get("shape"), list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in entry["shape"])
            and isinstance(entry.get("data_offsets"), list)
            and len(entry["data_offsets"]) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in entry["data_offsets"])
        )
        if not ok:
            raise InvalidRecord(f"{where} has a malformed header entry", remedy="the base is corrupt; re-download it")
        begin, end = entry["data_offsets"]
        numel = 1
        for d in entry["shape"]:
            numel *= d
        itemsize = torch.empty((), dtype=DTYPES[entry["dtype"]]).element_size()
        if not 0 <= begin <= end <= data_len or end - begin != numel * itemsize:
            raise InvalidRecord(f"{where} has byte range {begin}..{end} that does not fit its shape or the file",
                                remedy="the base is corrupt; re-download it")
        end_max = max(end_max, end)
    if end_max != data_len:
        raise InvalidRecord(f"safetensors shard {path} is {size} bytes, expected 8 + {n} + {end_max}",
                            remedy="the shard is truncated or has trailing bytes; re-download it")
    return SafetensorsShard(path=path, header=header, header_bytes=prefix + raw, data_start=8 + n)


@dataclass(frozen=True, slots=True)
class BaseIdentityDigests:
    config_sha256: str
    index_sha256: str


class BaseModel:
    """A Hugging Face base directory: config, weight map, lazily mapped shards."""

    def __init__(self, directory: Path):
        self.directory = directory
        if not directory.is_dir():
            raise NotFound(f"base {directory} is not a directory", remedy="pass --base HF_DIR (a Hugging Face model directory)")
        self.config_path = directory / "config.json"
        if not self.config_path.is_file():
            raise NotFound(f"base {directory} has no config.json", remedy="pass a Hugging Face model directory as --base")
        try:
            self.config = json.loads(self.config_path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidRecord(f"base config {self.config_path} is not valid JSON: {exc}") from None
        if not isinstance(self.config, dict):
            raise InvalidRecord(f"base config {self.config_path} is not a JSON object")
        self._shards: dict[str, SafetensorsShard] = {}
        index_path = directory / INDEX_NAME
        if index_path.is_file():
            index_bytes = index_path.read_bytes()
            self.weight_map = _parse_weight_map(index_bytes, index_path)
            self.index_sha256 = sha256_bytes(index_bytes)
        elif (directory / SINGLE_NAME).is_file():
            shard = read_safetensors_header(directory / SINGLE_NAME)
            self._shards[SINGLE_NAME] = shard
            self.weight_map = dict.fromkeys(shard.header, SINGLE_NAME)
            self.index_sha256 = sha256_bytes(shard.header_bytes)
        else:
            raise NotFound(f"base {directory} has neither {INDEX_NAME} nor {SINGLE_NAME}",
                           remedy="pass a Hugging Face model directory with safetensors weights")
        self.config_sha256 = sha256_file(self.config_path).sha256

    def identity(self) -> BaseIdentityDigests:
        return BaseIdentityDigests(self.config_sha256, self.index_sha256)

    def check_shards(self) -> None:
        """Open every shard the map names; its header keys must be exactly the map's keys for it."""
        expected: dict[str, set[str]] = {}
        for key, shard in self.weight_map.items():
            expected.setdefault(shard, set()).add(key)
        for shard_name, keys in sorted(expected.items()):
            found = set(self._shard(shard_name).header)
            if found != keys:
                diff = sorted(keys ^ found)[:5]
                raise InvalidRecord(f"base shard {self.directory / shard_name} holds other tensors than "
                                    f"{INDEX_NAME} says (first differences: {diff})",
                                    remedy="the base is inconsistent; re-download it")

    def info(self) -> dict[str, TensorInfo]:
        out = {}
        for key, shard_name in self.weight_map.items():
            entry = self._shard(shard_name).header[key]
            out[key] = TensorInfo(tuple(entry["shape"]), entry["dtype"])
        return out

    def tensor(self, key: str) -> torch.Tensor:
        return self._shard(self.weight_map[key]).tensor(key)

    def pages(self, key: str) -> PageReleaser | None:
        """The page releaser of the shard holding ``key`` (after ``tensor(key)`` mapped it)."""
        return self._shard(self.weight_map[key]).pages

    def _shard(self, name: str) -> SafetensorsShard:
        if name not in self._shards:
            self._shards[name] = read_safetensors_header(self.directory / name)
        return self._shards[name]


def _parse_weight_map(data: bytes, path: Path) -> dict[str, str]:
    try:
        index = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidRecord(f"base index {path} is not valid JSON: {exc}") from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise InvalidRecord(f"base index {path} has no non-empty weight_map object",
                            remedy="the base is corrupt; re-download it")
    for key, shard in weight_map.items():
        if not isinstance(shard, str):
            raise InvalidRecord(f"base index {path}: weight_map[{key!r}] is not a file name")
        safe_relpath(shard, what=f"base index {path}: shard of {key}")
    return weight_map
