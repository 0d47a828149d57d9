"""``--unified-chat-template``: one chat template for every loader of an export (no torch, nothing written).

A base ships its chat template twice: in ``tokenizer_config.json`` (what ``AutoTokenizer`` renders) and in
``chat_template.json`` (the processor's). They can disagree, typically in how an assistant turn's reasoning
is rendered in the branch taken with tools. In unified mode both files of the export carry the base's
*processor* template in its canonical form, every other byte of the two files unchanged:

* canonical form: in every output expression (``{{ … }}``) each reference to the reasoning content
  (``reasoning_content``, ``message.reasoning_content``, ``message['reasoning_content']``, with or without
  ``.strip(…)`` / ``| trim``) is rendered trimmed, as ``(<reference> | trim)``; nothing else changes, and
  the form is a fixed point (canonical of canonical is itself). A request with or without tools then
  renders the same reasoning form.
* the rewrite replaces only the ``chat_template`` value's JSON token in each file (one contiguous run of
  lines: the one-hunk diff the marker records); every other key keeps its bytes.

The base must not carry a template a loader prefers over those two files: ``chat_template.jinja`` (the
tokenizer's and the processor's first choice), any ``additional_chat_templates/`` (even empty: the
loaders list it), a ``chat_template`` key in ``processor_config.json``. Such a sidecar is refused by name,
except a file or key whose text equals the canonical template, which is allowed and recorded.
``unify`` is the one helper the preflight and the verifier share.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..digest import sha256_bytes
from ..errors import InvalidRecord
from ..fsutil import atomic_write_bytes
from ..jsonio import decode_json_object
from .sidecars import TEMPLATE_DIR

TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_JSON = "chat_template.json"
CHAT_TEMPLATE_JINJA = "chat_template.jinja"
PROCESSOR_CONFIG = "processor_config.json"
UNIFIED_FILES = (CHAT_TEMPLATE_JSON, TOKENIZER_CONFIG)  # rewritten, checked by rule instead of byte identity
KEY = "chat_template"
OPTION = "unified_chat_template"  # the identity option's name in .materialized

_REF = r"(?:message\s*\[\s*'reasoning_content'\s*\]|message\s*\[\s*\"reasoning_content\"\s*\]" \
       r"|(?:message\s*\.\s*)?reasoning_content)(?!\w)"
_TRIMS = r"(?:\s*\|\s*trim(?!\w)(?:\s*\(\s*\))?|\s*\.\s*[lr]?strip\s*\([^()]*\))*"
_REASONING = re.compile(rf"\(\s*(?P<canon>{_REF})\s*\|\s*trim\s*\)|(?<![\w.])(?P<ref>{_REF}){_TRIMS}")
_OUTPUT = re.compile(r"\{\{.*?\}\}", re.S)


def canonical(template: str) -> str:
    """The canonical form of a template (see the module doc)."""

    def trimmed(m: re.Match) -> str:
        return f"({m.group('canon') or m.group('ref')} | trim)"

    return _OUTPUT.sub(lambda block: _REASONING.sub(trimmed, block.group(0)), template)


@dataclass(frozen=True)
class Rewrite:
    """One of the two template files: the base's bytes and the bytes the export ships."""

    path: str
    base: bytes
    shipped: bytes
    diff: str  # unified diff, one hunk ("" when the base's file already holds the canonical template)

    def record(self) -> dict[str, Any]:
        return {"path": self.path, "base_sha256": sha256_bytes(self.base), "sha256": sha256_bytes(self.shipped),
                "diff": self.diff}


@dataclass(frozen=True)
class Unified:
    processor_template: str  # chat_template.json's chat_template in the base
    template: str  # its canonical form: what both files of the export carry
    files: tuple[Rewrite, ...]
    allowed: tuple[tuple[str, str], ...]  # (path, sha256) of loader-preferred sidecars equal to the template

    def expected(self) -> dict[str, bytes]:
        return {f.path: f.shipped for f in self.files}

    def record(self) -> dict[str, Any]:
        """What ``.materialized`` records under ``chat_template``."""
        return {"processor_template_sha256": sha256_bytes(self.processor_template.encode("utf-8")),
                "canonical_sha256": sha256_bytes(self.template.encode("utf-8")),
                "files": [f.record() for f in self.files],
                "allowed_sidecars": [{"path": p, "sha256": s} for p, s in self.allowed]}


def unify(base_dir: Path) -> Unified:
    """The unified templates of ``base_dir``; ``InvalidRecord`` naming the file that prevents them."""
    base_dir = Path(base_dir)
    processor = _read_json(base_dir, CHAT_TEMPLATE_JSON, "the processor template is read from it")
    source = processor.get(KEY)
    if not isinstance(source, str) or not source.strip():
        raise InvalidRecord(f"{base_dir / CHAT_TEMPLATE_JSON} has no non-empty '{KEY}' string (the processor template)",
                            path=str(base_dir / CHAT_TEMPLATE_JSON), remedy="fix chat_template.json in the base")
    template = canonical(source)
    _check_parses(template, base_dir / CHAT_TEMPLATE_JSON)
    allowed = _preferred_sidecars(base_dir, template)
    tokenizer = _read_json(base_dir, TOKENIZER_CONFIG, "the tokenizer's template is rewritten there")
    if KEY not in tokenizer:
        raise InvalidRecord(
            f"{base_dir / TOKENIZER_CONFIG} has no '{KEY}' key; --unified-chat-template rewrites the tokenizer's "
            "template there", path=str(base_dir / TOKENIZER_CONFIG),
            remedy="use a base that ships its tokenizer template in tokenizer_config.json, or drop --unified-chat-template")
    files = tuple(_rewrite(base_dir, rel, template) for rel in UNIFIED_FILES)
    return Unified(source, template, files, allowed)


def write_unified(tree: Path, unified: Unified) -> list[str]:
    """Give the two template files of ``tree`` their unified bytes, each that differs through a ``.writing``
    temporary (fsynced) and a replace, so a kill leaves the old file or the new one. Returns what was written."""
    written = []
    for rel, data in unified.expected().items():
        dst = Path(tree) / rel
        if dst.is_file() and not dst.is_symlink() and dst.read_bytes() == data:
            continue
        atomic_write_bytes(dst, data, suffix=".writing")  # the temporary recovery sweeps by its suffix
        written.append(rel)
    return written


def _read_json(base_dir: Path, rel: str, why: str) -> dict:
    path = base_dir / rel
    if not path.is_file():
        raise InvalidRecord(f"base {base_dir} has no {rel} ({why} under --unified-chat-template)", path=str(path),
                            remedy="use a base that ships it, or drop --unified-chat-template")
    return decode_json_object(path.read_bytes(), what=f"sidecar {path}")


def _check_parses(template: str, path: Path) -> None:
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment().parse(template)
    except TemplateSyntaxError as exc:
        raise InvalidRecord(f"the '{KEY}' of {path} does not parse as a Jinja template in its canonical form "
                            f"({exc.message}, line {exc.lineno})", path=str(path),
                            remedy="fix the processor template in the base") from None


def _preferred_sidecars(base_dir: Path, template: str) -> tuple[tuple[str, str], ...]:
    """Sidecars a loader prefers over the two JSON files: refused unless equal to ``template``."""
    allowed = []
    remedy = "remove it from (a copy of) the base, or drop --unified-chat-template"
    directory = base_dir / TEMPLATE_DIR
    if os.path.lexists(directory):
        raise InvalidRecord(f"{directory} exists (the loaders list the templates in it, empty or not, and "
                            "--unified-chat-template cannot make them agree)", path=str(directory), remedy=remedy)
    jinja = base_dir / CHAT_TEMPLATE_JINJA
    if os.path.lexists(jinja):
        data = jinja.read_bytes()
        if data != template.encode("utf-8"):
            raise InvalidRecord(f"{jinja} holds another template than the canonical processor template (the "
                                "loaders prefer it over tokenizer_config.json and chat_template.json)",
                                path=str(jinja), remedy=remedy)
        allowed.append((CHAT_TEMPLATE_JINJA, sha256_bytes(data)))
    config = base_dir / PROCESSOR_CONFIG
    if os.path.lexists(config):
        obj = decode_json_object(config.read_bytes(), what=f"sidecar {config}")
        if KEY in obj:
            if obj[KEY] != template:
                raise InvalidRecord(f"{config} has a '{KEY}' key with another template than the canonical processor "
                                    "template (the processor loader prefers it over chat_template.json)",
                                    path=str(config), remedy=remedy)
            allowed.append((PROCESSOR_CONFIG, sha256_bytes(config.read_bytes())))
    return tuple(allowed)


def _rewrite(base_dir: Path, rel: str, template: str) -> Rewrite:
    data = (base_dir / rel).read_bytes()
    text = data.decode("utf-8")  # strict: decode_json_object accepted it
    start, end = value_span(text, KEY)
    new = text[:start] + json.dumps(template, ensure_ascii=False) + text[end:]
    return Rewrite(rel, data, new.encode("utf-8"), one_hunk_diff(rel, text, new, start, end))


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def value_span(text: str, key: str) -> tuple[int, int]:
    """Character span of ``key``'s value token in the top-level JSON object ``text`` (the last one, like
    ``json.loads``). ``text`` has been decoded as a JSON object already."""
    decoder, scan = json.JSONDecoder(), json.decoder.scanstring
    i, found = _ws(text, 0) + 1, None
    while True:
        i = _ws(text, i)
        if text[i] == "}":
            break
        name, i = scan(text, i + 1)
        i = _ws(text, _ws(text, i) + 1)  # past ':'
        _, end = decoder.raw_decode(text, i)
        if name == key:
            found = (i, end)
        i = _ws(text, end)
        if text[i] != ",":
            break
        i += 1
    if found is None:
        raise KeyError(key)
    return found


def one_hunk_diff(rel: str, old: str, new: str, start: int, end: int) -> str:
    """The unified diff of a replacement of ``old[start:end]``: the lines it touches, one hunk ("" if equal)."""
    if old == new:
        return ""
    first = old.count("\n", 0, start)  # 0-based line of the token's start
    old_lines, new_lines = old.splitlines(keepends=True), new.splitlines(keepends=True)
    tail = len(old_lines) - (old.count("\n", 0, end) + 1)  # lines after the token's last line
    removed, added = old_lines[first:len(old_lines) - tail], new_lines[first:len(new_lines) - tail]
    hunk = [f"@@ -{first + 1},{len(removed)} +{first + 1},{len(added)} @@\n"]
    hunk += ["-" + _eol(line) for line in removed] + ["+" + _eol(line) for line in added]
    return f"--- base/{rel}\n+++ export/{rel}\n" + "".join(hunk)


def _eol(line: str) -> str:
    return line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
