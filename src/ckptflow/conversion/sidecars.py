"""The non-weight files of a Hugging Face base that an export carries over byte for byte.

Sidecars are the base's top-level regular files that are not weights (``*.safetensors``, ``*.bin``, index
files …), not hidden (``.*``, where ckptflow keeps its own markers) and not ``config.json`` (copied
verbatim on its own), plus the ``additional_chat_templates/`` directory: tokenizer_config.json,
tokenizer.json, chat_template.json, chat_template.jinja, processor_config.json, preprocessor_config.json,
generation_config.json, vocab/merges files, README/LICENSE. Other sub-directories (for example an
``original/`` folder of raw weights) are not copied and are listed as ignored.

Symlinked files in the base are followed (a Hugging Face cache snapshot is made of links); the export
always holds regular files. Every ``*.json`` sidecar must decode as a JSON object through the project's
one strict decoder (a BOM is refused by name) and every ``*.jinja`` template as strict UTF-8, before
anything is written.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidRecord, NotFound, UnsafePath, VerificationFailed
from ..jsonio import decode_json_object
from .shards import is_weight_file

CONFIG_NAME = "config.json"
TEMPLATE_DIR = "additional_chat_templates"


@dataclass(frozen=True)
class Sidecars:
    files: tuple[str, ...]  # relative POSIX paths, sorted
    ignored: tuple[str, ...]  # base entries not carried over (sub-directories other than the template dir)


def list_sidecars(base_dir: Path) -> Sidecars:
    base_dir = Path(base_dir)
    files: list[str] = []
    ignored: list[str] = []
    for name in sorted(os.listdir(base_dir)):
        path = base_dir / name
        if name.startswith(".") or name == CONFIG_NAME:
            continue
        if path.is_dir():
            if name == TEMPLATE_DIR and not path.is_symlink():
                files.extend(_template_dir(path))
            else:
                ignored.append(name + "/")
            continue
        if not path.is_file():
            raise UnsafePath(f"base entry {path} is not a regular file", remedy="remove it from the base directory")
        if not is_weight_file(name):
            files.append(name)
    return Sidecars(tuple(sorted(files)), tuple(ignored))


def _template_dir(path: Path) -> list[str]:
    out = []
    for name in sorted(os.listdir(path)):
        st = os.stat(path / name)  # follows a link to a file, like the loaders do
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(
                f"{path / name} is not a regular file",
                remedy=f"{TEMPLATE_DIR}/ may hold only template files; remove it from the base",
            )
        out.append(f"{TEMPLATE_DIR}/{name}")
    return out


def validate_sidecar(path: Path, rel: str) -> None:
    """Decode a JSON sidecar as an object / a Jinja template as UTF-8, or raise ``InvalidRecord`` naming it."""
    if rel.endswith(".json"):
        decode_json_object(path.read_bytes(), what=f"sidecar {path}")
    elif rel.endswith(".jinja"):
        data = path.read_bytes()
        if data.startswith(b"\xef\xbb\xbf"):
            raise InvalidRecord(f"template {path} starts with a UTF-8 byte-order mark", remedy="rewrite it as UTF-8 without BOM")
        try:
            data.decode("utf-8", errors="strict")
        except UnicodeDecodeError as exc:
            raise InvalidRecord(
                f"template {path} is not valid UTF-8 ({exc.reason} at byte {exc.start})", remedy="fix the template in the base"
            ) from None


def read_config(base_dir: Path) -> tuple[bytes, dict]:
    path = Path(base_dir) / CONFIG_NAME
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"base {base_dir} has no {CONFIG_NAME}", path=str(path), remedy="point --base at a Hugging Face model directory") from None
    return data, decode_json_object(data, what=str(path))


def copy_sidecars(base_dir: Path, out_dir: Path, files: tuple[str, ...]) -> None:
    """Copy each sidecar (and config.json) byte for byte; the destination must not exist yet."""
    for rel in (CONFIG_NAME, *files):
        dst = Path(out_dir) / rel
        dst.parent.mkdir(exist_ok=True)
        with open(Path(base_dir) / rel, "rb") as src, open(dst, "xb") as out:
            shutil.copyfileobj(src, out, 16 << 20)
            out.flush()
            os.fsync(out.fileno())


def check_identical(base_dir: Path, out_dir: Path, files: tuple[str, ...],
                    expected: dict[str, bytes] | None = None) -> None:
    """``config.json`` and every sidecar of the base exist in ``out_dir`` with the same bytes; a file in
    ``expected`` (the two template files under --unified-chat-template) with those bytes instead."""
    for rel in (CONFIG_NAME, *files):
        src, dst = Path(base_dir) / rel, Path(out_dir) / rel
        if not dst.is_file() or dst.is_symlink():
            raise VerificationFailed(f"{dst} is missing (the base has {rel})", path=str(dst), remedy="rebuild the export")
        if expected is not None and rel in expected:
            if dst.read_bytes() != expected[rel]:
                raise VerificationFailed(
                    f"sidecar {dst} is not the base's {src} with its chat_template replaced by the canonical processor "
                    "template (--unified-chat-template: that one value changes, every other byte is the base's)",
                    path=str(dst), remedy="rebuild the export from this base")
            continue
        if not _same_bytes(src, dst):
            what = "config" if rel == CONFIG_NAME else "sidecar"
            raise VerificationFailed(
                f"{what} {dst} differs from the base's {src}", path=str(dst), remedy="rebuild the export from this base"
            )


def unexpected_files(out_dir: Path, expected: set[str]) -> list[str]:
    """Visible entries of an export that are not in ``expected`` (hidden ``.*`` entries belong to ckptflow).

    A stray ``chat_template.jinja`` or tokenizer file would change what the loaders read, so an export
    holds the base's files and its own weights, nothing else.
    """
    out = []
    for name in sorted(os.listdir(out_dir)):
        if name.startswith("."):
            continue
        path = Path(out_dir) / name
        base_has_templates = any(e.startswith(TEMPLATE_DIR + "/") for e in expected)
        if name == TEMPLATE_DIR and base_has_templates and path.is_dir() and not path.is_symlink():
            out.extend(f"{name}/{n}" for n in sorted(os.listdir(path)) if f"{name}/{n}" not in expected)
        elif path.is_dir() or name not in expected:
            out.append(name + ("/" if path.is_dir() else ""))
    return out


def _same_bytes(a: Path, b: Path, block: int = 16 << 20) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(block), fb.read(block)
            if x != y:
                return False
            if not x:
                return True


def load_with_transformers(model_dir: Path) -> dict[str, str]:
    """Load the sidecars with the transformers loaders a teacher uses; return loader -> ``ok`` or ``skipped: …``.

    ``AutoProcessor`` is skipped when torchvision is absent: Qwen-VL processors import their video processor,
    which needs it (loading them on a CPU-only torch fails for that reason alone, not for the files).
    ``AutoImageProcessor`` runs only when the directory has ``preprocessor_config.json`` (and needs pillow or
    torchvision: a Qwen-VL image processor has a PIL and a torchvision implementation). A loader that fails
    raises ``VerificationFailed`` naming it, the directory and the loader's own message.
    """
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer, GenerationConfig

    model_dir = Path(model_dir)
    report: dict[str, str] = {}
    _load(report, "AutoTokenizer", AutoTokenizer, model_dir)
    if (model_dir / "generation_config.json").is_file():
        _load(report, "GenerationConfig", GenerationConfig, model_dir)
    if (model_dir / "preprocessor_config.json").is_file():
        has_torchvision = importlib.util.find_spec("torchvision") is not None
        if has_torchvision or importlib.util.find_spec("PIL") is not None:
            _load(report, "AutoImageProcessor", AutoImageProcessor, model_dir)
        else:
            report["AutoImageProcessor"] = "skipped: neither pillow nor torchvision is installed"
        if has_torchvision:
            _load(report, "AutoProcessor", AutoProcessor, model_dir)
        else:
            report["AutoProcessor"] = "skipped: torchvision is not installed (Qwen-VL processors import it)"
    return report


def _load(report: dict[str, str], name: str, loader, model_dir: Path) -> None:
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        loader.from_pretrained(str(model_dir))
    except Exception as exc:  # noqa: BLE001 - the loaders raise many types; report the loader and its message
        raise VerificationFailed(f"{name}.from_pretrained cannot load {model_dir}: {type(exc).__name__}: {exc}",
                                 path=str(model_dir),
                                 remedy="fix the base's tokenizer / processor / generation files (they are copied "
                                 "as they are), then rerun") from None
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    report[name] = "ok"
