"""safetensors shards and their index: strict header reading, streaming shard writing, the index file.

A safetensors file is ``u64 little-endian N`` + ``N`` bytes of JSON header + the data buffer. The header
maps each tensor name to ``{"dtype", "shape", "data_offsets": [start, end]}`` (offsets into the data
buffer) and may hold a ``__metadata__`` object of strings. :func:`read_header` accepts a file only when
the offsets tile the buffer exactly (sorted, contiguous, from 0, each ``end - start`` = numel × itemsize)
and the file length is ``8 + N + buffer``; then it asks the pinned safetensors reader to open it too.
Reading and validating needs no torch (the materialize preflight runs before torch is imported); only
writing a shard does.

The index ``model.safetensors.index.json`` is ``{"metadata": {"total_size": <tensor bytes>},
"weight_map": {name: shard file}}``; it is written last, atomically, so an index names only complete shards.
Shard names follow Hugging Face: ``model-0000K-of-0000N.safetensors``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidRecord
from ..fsutil import atomic_write_bytes, safe_relpath
from ..jsonio import decode_json_object, encode_json
from .dtypes import ITEMSIZE, TensorInfo

if TYPE_CHECKING:
    import torch

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
DEFAULT_MAX_SHARD_BYTES = 5 * 10**9
# Headers larger than this are refused before being read (safetensors' own reader uses 100 MB).
MAX_HEADER_BYTES = 100_000_000

_ITEMSIZE = ITEMSIZE


def nbytes(info: TensorInfo) -> int:
    """Bytes of a tensor with this shape and (safetensors) dtype."""
    assert info.dtype is not None
    return info.numel * _ITEMSIZE[info.dtype]


def shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


@dataclass(frozen=True)
class Entry:
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def info(self) -> TensorInfo:
        return TensorInfo(self.shape, self.dtype)


@dataclass(frozen=True)
class ShardHeader:
    """A validated safetensors header: entries in data order, ``data_start`` = 8 + header length."""

    path: Path
    entries: dict[str, Entry]
    metadata: dict[str, str] | None
    data_start: int
    file_size: int


def read_header(path: Path) -> ShardHeader:
    """Read and validate one shard's header (see the module doc); ``InvalidRecord`` names the file and fault."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(8)
            if len(head) < 8:
                raise _bad(path, f"is {size} bytes, too short for a safetensors header")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise _bad(path, f"declares a {n}-byte header in a {size}-byte file")
            raw = fh.read(n)
    except FileNotFoundError:
        raise InvalidRecord(f"shard {path} does not exist", path=str(path), remedy="rebuild or re-download it") from None
    header = decode_json_object(raw.rstrip(b" "), what=f"safetensors header of {path}")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and (
        not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())
    ):
        raise _bad(path, "has a __metadata__ that is not an object of strings")
    entries: dict[str, Entry] = {}
    for name, spec in header.items():
        entries[name] = _entry(path, name, spec)
    ordered = sorted(entries.items(), key=lambda kv: (kv[1].start, kv[1].end))
    pos = 0
    for name, e in ordered:
        if e.start != pos:
            raise _bad(path, f"tensor {name} starts at {e.start}, expected {pos} (offsets must be contiguous)")
        pos = e.end
    data_start = 8 + n
    if data_start + pos != size:
        raise _bad(path, f"is {size} bytes but header + data = {data_start + pos} (8 + {n} + {pos})")
    _safetensors_opens(path)
    return ShardHeader(path, dict(ordered), metadata, data_start, size)


def _entry(path: Path, name: str, spec: Any) -> Entry:
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise _bad(path, f"entry {name!r} is not {{dtype, shape, data_offsets}}")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _ITEMSIZE:
        raise _bad(path, f"entry {name!r} has unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _bad(path, f"entry {name!r} has shape {shape!r}, not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        or offsets[1] < offsets[0]
    ):
        raise _bad(path, f"entry {name!r} has data_offsets {offsets!r}, not [start, end] integers")
    numel = 1
    for d in shape:
        numel *= d
    if offsets[1] - offsets[0] != numel * _ITEMSIZE[dtype]:
        raise _bad(path, f"entry {name!r} spans {offsets[1] - offsets[0]} bytes, {dtype}{shape} needs {numel * _ITEMSIZE[dtype]}")
    return Entry(dtype, tuple(shape), offsets[0], offsets[1])


def _safetensors_opens(path: Path) -> None:
    """The pinned safetensors reader must accept the file as well (its checks are the loader's checks)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:  # the header only: no torch needed
            f.keys()
    except Exception as exc:  # noqa: BLE001 - the reader raises its own error types; report them by name
        raise _bad(path, f"is refused by safetensors: {type(exc).__name__}: {exc}") from None


def _bad(path: Path, problem: str) -> InvalidRecord:
    return InvalidRecord(f"safetensors shard {path} {problem}", path=str(path), remedy="the file is corrupt; rebuild or re-download it")


@dataclass(frozen=True)
class Index:
    """A validated ``model.safetensors.index.json`` (or a single ``model.safetensors`` seen as one)."""

    path: Path
    weight_map: dict[str, str]
    total_size: int | None

    def shards(self) -> list[str]:
        return sorted(set(self.weight_map.values()))


def read_index(directory: Path, *, what: str) -> Index:
    """The directory's index; a lone ``model.safetensors`` counts as a one-shard index."""
    directory = Path(directory)
    path = directory / INDEX_NAME
    if not path.is_file():
        single = directory / SINGLE_NAME
        if single.is_file():
            names = read_header(single).entries
            return Index(single, {k: SINGLE_NAME for k in names}, None)
        raise InvalidRecord(
            f"{what} {directory} has neither {INDEX_NAME} nor {SINGLE_NAME}",
            path=str(directory),
            remedy="point at a Hugging Face model directory with safetensors weights",
        )
    obj = decode_json_object(path.read_bytes(), what=str(path))
    weight_map = obj.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise InvalidRecord(f"{path}: weight_map must be a non-empty object", path=str(path), remedy="rebuild the index")
    for name, shard in weight_map.items():
        if not isinstance(shard, str):
            raise InvalidRecord(f"{path}: weight_map[{name!r}] is not a file name", path=str(path), remedy="rebuild the index")
        safe_relpath(shard, what=f"{path} weight_map[{name!r}]")
    metadata = obj.get("metadata", {})
    if not isinstance(metadata, dict):
        raise InvalidRecord(f"{path}: metadata must be an object", path=str(path), remedy="rebuild the index")
    total = metadata.get("total_size")
    if total is not None and (not isinstance(total, int) or isinstance(total, bool) or total < 0):
        raise InvalidRecord(f"{path}: metadata.total_size {total!r} is not a byte count", path=str(path), remedy="rebuild the index")
    return Index(path, dict(weight_map), total)


def read_headers(directory: Path, index: Index) -> dict[str, ShardHeader]:
    """Every shard's header, checked against the index: each shard holds exactly the keys the index gives it."""
    headers: dict[str, ShardHeader] = {}
    by_shard: dict[str, set[str]] = {}
    for key, shard in index.weight_map.items():
        by_shard.setdefault(shard, set()).add(key)
    for shard, keys in sorted(by_shard.items()):
        header = read_header(Path(directory) / shard)
        found = set(header.entries)
        if found != keys:
            missing, extra = sorted(keys - found), sorted(found - keys)
            raise InvalidRecord(
                f"shard {header.path} does not hold what {index.path.name} says: "
                f"{len(missing)} listed but absent {missing[:20]}, {len(extra)} present but unlisted {extra[:20]}",
                path=str(header.path),
                remedy="the directory is inconsistent; rebuild or re-download it",
            )
        headers[shard] = header
    return headers


def plan_shards(sizes: Sequence[tuple[str, int]], max_shard_bytes: int) -> list[list[str]]:
    """Split ``(key, nbytes)`` in order into shards of at most ``max_shard_bytes`` (a larger tensor sits alone)."""
    if max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
    shards: list[list[str]] = [[]]
    used = 0
    for key, nbytes in sizes:
        if shards[-1] and used + nbytes > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(key)
        used += nbytes
    return shards if shards[0] else []


def encode_header(infos: Iterable[tuple[str, TensorInfo]]) -> tuple[bytes, dict[str, tuple[int, int]]]:
    """Header bytes (length prefix included, padded to 8 bytes with spaces) and each tensor's data offsets."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offsets: dict[str, tuple[int, int]] = {}
    pos = 0
    for key, info in infos:
        size = nbytes(info)
        header[key] = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": [pos, pos + size]}
        offsets[key] = (pos, pos + size)
        pos += size
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offsets


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy byte view of a contiguous tensor (a memory-mapped tensor stays mapped)."""
    import torch

    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def write_shard(
    path: Path,
    infos: Sequence[tuple[str, TensorInfo]],
    chunks: Callable[[str], Iterator[torch.Tensor]],
    *,
    on_bytes: Callable[[int], None] | None = None,
    fsync: bool = True,
) -> int:
    """Create ``path`` (exclusively) and stream each tensor's chunks into it; return the file size."""
    head, offsets = encode_header(infos)
    with open(path, "xb") as fh:
        fh.write(head)
        for key, _info in infos:
            start, end = offsets[key]
            written = 0
            for chunk in chunks(key):
                view = tensor_bytes(chunk)
                fh.write(view)
                written += view.nbytes
                if on_bytes is not None:
                    on_bytes(view.nbytes)
                del chunk, view
            if written != end - start:
                raise AssertionError(f"{key}: wrote {written} bytes, header says {end - start}")
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())
        return fh.tell()


def write_index(directory: Path, weight_map: Mapping[str, str], total_size: int) -> Path:
    path = Path(directory) / INDEX_NAME
    data = encode_json({"metadata": {"total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))})
    atomic_write_bytes(path, data)
    return path


def weight_file_names(directory: Path) -> list[str]:
    """Top-level files a loader could take weights from (``*.safetensors``, ``*.bin``, their indexes …)."""
    out = []
    for entry in sorted(os.listdir(directory)):
        if is_weight_file(entry):
            out.append(entry)
    return out


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".gguf", ".h5", ".msgpack", ".onnx", ".npz")


def is_weight_file(name: str) -> bool:
    return name.endswith(_WEIGHT_SUFFIXES) or name.endswith(".index.json")
