"""The preflight: checks of the base alone, before anything beside --out is restored, removed or written.

Every refusal is one message family, ``REFUSED before anything is published: <what was found>; <what
the staged build would have done with it>``, with the file named. It reads the base as the staged build
will (``conversion.source.read_base``: config.json and every JSON sidecar decoded through one strict
UTF-8 decoder as objects, a byte-order mark refused by name; the index's ``weight_map`` a non-empty
object of tensor name -> shard; every listed shard present, readable, its header a JSON object of
well-formed entries with contiguous offsets, size = 8 + header + data, keys = the index's, and opened by
the pinned ``safe_open``; every Jinja template strict UTF-8; ``additional_chat_templates/`` regular files
only), then adds what the loaders index after the overlay (``chat_template.json`` carries a non-empty
``chat_template`` string), the tensor floor / exact count, and, for a build, free space for the staged
export beside the existing one (two exports side by side until the swap). Under --unified-chat-template
(with or without --no-verify) ``check_unified`` also refuses a base whose loaders would prefer another
template than the unified one (``conversion.chat_template``), naming the file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from ..conversion import chat_template
from ..conversion import shards as hf_shards
from ..conversion.source import Base, read_base
from ..errors import CkptflowError, Refused
from ..jsonio import decode_json_object

PREFIX = "REFUSED before anything is published"
CHAT_TEMPLATE_JSON = "chat_template.json"
_READS = "the staged build reads it (overlay, sidecar copy, loaders) and would have failed there"


def refused(found: str, would: str, *, path: Path | str | None, remedy: str) -> Refused:
    return Refused(f"{PREFIX}: {found}; {would}", path=str(path) if path is not None else None, remedy=remedy)


@contextlib.contextmanager
def _refusing_base(base_dir: Path, would: str, remedy: str) -> Iterator[None]:
    """A base that is invalid (``remedy`` unless the error has its own) or unreadable, as a refusal naming the file."""
    try:
        yield
    except CkptflowError as exc:
        raise refused(f"base {base_dir}: {exc.message}", would, path=exc.path or base_dir,
                      remedy=exc.remedy or remedy) from None
    except OSError as exc:
        where = exc.filename or base_dir
        raise refused(f"base file {where} cannot be read ({exc.strerror or exc})", would, path=where,
                      remedy="make the base readable by this user (permissions, mounts), then rerun") from None


def check_base(base_dir: Path, *, expect_tensors: int, min_tensors: int) -> Base:
    """Read and validate the base (see the module doc); ``Refused`` in the one family, naming the file."""
    with _refusing_base(base_dir, _READS, "fix or re-download the base"):
        base = read_base(base_dir)
        _check_chat_template(base_dir)
    count = len(base.index.weight_map)
    if count < min_tensors:
        raise refused(f"base {base_dir} has {count} tensors, fewer than the floor of {min_tensors} (--min-tensors)",
                      "the staged build would have exported that many and failed its tensor floor", path=base_dir,
                      remedy="check that the base is the full model, or lower --min-tensors")
    if expect_tensors > 0 and count != expect_tensors:
        raise refused(f"base {base_dir} has {count} tensors, --expect-tensors says {expect_tensors}",
                      "the staged build would have exported that many and failed the exact count", path=base_dir,
                      remedy="check the base, or fix --expect-tensors")
    return base


_UNIFIED = ("--unified-chat-template writes the base's processor template into tokenizer_config.json and "
            "chat_template.json, and the staged build would have shipped templates a loader does not read as that one")


def check_unified(base_dir: Path) -> chat_template.Unified:
    """Under --unified-chat-template (with or without --no-verify): the unified templates of the base, or a
    refusal naming the file that prevents them (``chat_template.unify``, the verifier's helper too)."""
    with _refusing_base(base_dir, _UNIFIED, "fix the base, or drop --unified-chat-template"):
        return chat_template.unify(base_dir)


def _check_chat_template(base_dir: Path) -> None:
    path = base_dir / CHAT_TEMPLATE_JSON
    if not os.path.lexists(path):
        return
    obj = decode_json_object(path.read_bytes(), what=f"sidecar {path}")
    template = obj.get("chat_template")
    if not isinstance(template, str) or not template.strip():
        raise Refused(f"{path} has no non-empty 'chat_template' string (found {type(template).__name__})",
                      path=str(path), remedy="fix chat_template.json in the base (the processor loader indexes it)")


def export_bytes(base: Base) -> int:
    """What a staged export of ``base`` occupies: the tensor data, shard headers, config and sidecars."""
    tensors = sum(hf_shards.nbytes(info) for info in base.infos().values())
    small = sum(os.path.getsize(base.path / rel) for rel in base.sidecars.files) + len(base.config_bytes)
    return tensors + small + (1 << 20)  # headers and the index: far below a MiB for any model


def _existing(path: Path) -> Path | None:
    for candidate in (path, *path.parents):
        if os.path.isdir(candidate):
            return candidate
    return None


def free_bytes(path: Path) -> int:
    existing = _existing(path)
    return shutil.disk_usage(existing).free if existing is not None else 0


def export_after_fetch(stage: Path, out: Path, base: Base) -> int:
    """Bytes the staged export needs after a fetch into ``stage``: the export's size when both are on one
    file system (the fetch's free-space check then keeps room for it), else 0."""
    a, b = _existing(stage), _existing(out.parent)
    if a is None or b is None or os.stat(a).st_dev != os.stat(b).st_dev:
        return 0
    return export_bytes(base)


def check_space(out: Path, base: Base) -> None:
    """The staged export must fit beside the existing output (both are on disk until the swap)."""
    need, free = export_bytes(base), free_bytes(out.parent)
    if free < need:
        raise refused(f"{out.parent} has {free} bytes free, the staged export of {base.path} needs {need}",
                      "the staged build writes a second export beside the existing output until the swap and "
                      "would have run out of space", path=out.parent,
                      remedy="free space (two exports side by side), or choose another --out")
