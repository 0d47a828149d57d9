"""Finds, from the code, every call that removes, truncates or replaces bytes, and reads the registry of them.

A *destructive call* is one of:

- removal: ``os.unlink``/``os.remove``/``Path.unlink``, ``os.rmdir``/``Path.rmdir``, ``shutil.rmtree``;
- replacement: ``os.rename``/``os.replace``/``Path.rename``/``Path.replace`` (over a path that may exist),
  ``shutil.move`` and ``shutil.copyfile``/``copy``/``copy2``/``copytree`` (onto a path that may exist);
- truncation: ``os.truncate``/``os.ftruncate``/``file.truncate``, ``open(..., "w"...)``/``Path.open("w")``,
  ``os.open`` with ``O_TRUNC``, ``Path.write_text``/``Path.write_bytes``;
- on a store: ``abort_multipart_upload``, ``delete_object(s)``, and every call of a store's own
  ``delete``/``abort_upload``/``abort_unused``;
- a store write, which replaces whatever object stood at its key: ``put_object``, ``copy_object``,
  ``complete_multipart_upload``, ``upload_file``/``upload_fileobj`` (also when the client's method is passed to
  a wrapper that calls it, ``store._call("PUT", key, client.put_object, ...)``), an HTTP request built with
  ``PUT``/``POST`` (``requests.Request("PUT", ...)``: the GCS XML uploads), and every call of a store's own
  ``put_file``/``put_files``/``put_bytes_create_once``/``put_bytes_wrong_checksum``. An ``upload_part`` is not
  one: a part is invisible until its upload is completed.

``str.replace`` (two or more arguments) and ``dataclasses.replace``/``datetime.replace`` (keywords) are not
byte replacements and are not counted.

The registry (``tests/destructive_calls.txt``) holds one entry per call site, keyed by file, enclosing
function and call, with the number of such calls there::

    src/ckptflow/archive/stage.py :: remove_recorded_files :: unlink x1
        what: a staged file of an earlier fetch
        proof: the file is named by this tool's complete .staged.json and ...
        test: tests/archive/test_fetch.py::test_foreign_file_in_stage_survives
        by: fetch, materialize_teacher

``what`` names the bytes in a few words; ``proof`` says what proves the bytes are this tool's own or stored elsewhere; ``test`` names one or more
tests (``path::name``, comma separated) that show the proof holds; ``by`` names the commands and workflow
targets that reach the call (the documentation's registry page, docs/reference/destructive-calls.md, is
generated from it by `make docs-pages`).
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REGISTRY = REPO / "tests" / "destructive_calls.txt"
SCANNED = ("src", "scripts")

REMOVE = {"unlink", "remove", "rmdir", "rmtree"}
REPLACE = {"rename", "replace", "move", "copyfile", "copy", "copy2", "copytree"}
TRUNCATE = {"truncate", "ftruncate", "write_text", "write_bytes"}
STORE = {"abort_multipart_upload", "delete_object", "delete_objects", "delete", "abort_upload", "abort_unused"}
CLIENT_WRITES = {"put_object", "copy_object", "complete_multipart_upload", "upload_file", "upload_fileobj"}
STORE_WRITES = CLIENT_WRITES | {"put_file", "put_files", "put_bytes_create_once", "put_bytes_wrong_checksum"}
HTTP_WRITES = {"PUT", "POST"}
WRITE_MODE = re.compile(r"[wx]|\+")


@dataclass(frozen=True, order=True)
class Site:
    file: str
    function: str
    call: str


@dataclass
class Entry:
    site: Site
    count: int
    what: str
    proof: str
    tests: list[str]
    by: list[str]


def _called_name(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _receiver(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return func.value.id
    return ""


def _mode(node: ast.Call, position: int) -> str | None:
    if len(node.args) > position and isinstance(node.args[position], ast.Constant):
        value = node.args[position].value
        return value if isinstance(value, str) else None
    for kw in node.keywords:
        if kw.arg == "mode" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
            return kw.value.value
    return None


def classify(node: ast.Call) -> str | None:
    """The registry's name for a destructive call, or None."""
    name = _called_name(node)
    if name is None:
        return None
    receiver = _receiver(node)
    if name in REMOVE:
        if name == "remove" and receiver not in ("os",):
            return None  # list.remove / set.remove
        return name
    if name in REPLACE:
        if name == "replace":
            if receiver in ("dataclasses", "datetime"):
                return None
            if node.keywords or len(node.args) != (2 if receiver == "os" else 1):
                return None  # str.replace(old, new), dataclasses.replace(obj, **changes)
        if name in ("move", "copyfile", "copy", "copy2", "copytree") and receiver != "shutil":
            return None  # copy onto a path that may exist replaces its bytes
        return name
    if name in TRUNCATE:
        return name
    if name in STORE or name in STORE_WRITES:
        return name
    if name in ("Request", "request") and node.args and isinstance(node.args[0], ast.Constant) \
            and node.args[0].value in HTTP_WRITES:
        return f"http {node.args[0].value}"
    passed = [a.attr for a in node.args if isinstance(a, ast.Attribute) and a.attr in CLIENT_WRITES | STORE]
    if passed:
        return passed[0]  # a client's write handed to a wrapper that calls it
    if name == "open":
        if receiver == "os":
            flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
            return "os.open O_TRUNC" if "O_TRUNC" in flags else None
        # builtins.open(path, mode) / io.open(path, mode): mode second; Path.open(mode): mode first
        mode = _mode(node, 1 if isinstance(node.func, ast.Name) or receiver in ("io", "builtins") else 0)
        if mode is not None and "w" in mode:
            return f'open "{mode}"'
    return None


class _Finder(ast.NodeVisitor):
    def __init__(self, file: str) -> None:
        self.file = file
        self.scope: list[str] = []
        self.found: Counter[Site] = Counter()

    def _visit_scope(self, node) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _visit_scope

    def visit_Call(self, node: ast.Call) -> None:
        kind = classify(node)
        if kind is not None:
            self.found[Site(self.file, ".".join(self.scope) or "<module>", kind)] += 1
        self.generic_visit(node)


def find_sites(repo: Path = REPO) -> Counter[Site]:
    """Every destructive call site under src/ and scripts/, with its number of calls."""
    found: Counter[Site] = Counter()
    for top in SCANNED:
        for path in sorted((repo / top).rglob("*.py")):
            rel = path.relative_to(repo).as_posix()
            finder = _Finder(rel)
            finder.visit(ast.parse(path.read_text(encoding="utf-8"), filename=rel))
            found.update(finder.found)
    return found


_HEAD = re.compile(r"^(?P<file>\S+) :: (?P<function>\S+) :: (?P<call>.+?) x(?P<count>\d+)$")
_FIELD = re.compile(r"^    (?P<key>what|proof|test|by): (?P<value>.+)$")


def read_registry(path: Path = REGISTRY) -> list[Entry]:
    """The registry's entries; a malformed line raises ValueError naming it."""
    entries: list[Entry] = []
    current: dict | None = None

    def close() -> None:
        if current is not None:
            entries.append(
                Entry(
                    site=current["site"],
                    count=current["count"],
                    what=current.get("what", ""),
                    proof=current.get("proof", ""),
                    tests=[t.strip() for t in current.get("test", "").split(",") if t.strip()],
                    by=[b.strip() for b in current.get("by", "").split(",") if b.strip()],
                )
            )

    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        head = _HEAD.match(line)
        if head:
            close()
            current = {
                "site": Site(head["file"], head["function"], head["call"]),
                "count": int(head["count"]),
            }
            continue
        field = _FIELD.match(line)
        if field is None or current is None:
            raise ValueError(f"{path.name}:{number}: not an entry head nor a what/proof/test/by line: {line!r}")
        current[field["key"]] = (current.get(field["key"], "") + " " + field["value"]).strip()
    close()
    return entries


BEGIN = "<!-- destructive-calls: generated from tests/destructive_calls.txt by `make docs-pages`; do not edit -->"
END = "<!-- destructive-calls: end -->"


def render_guarantees(entries: list[Entry]) -> str:
    """The guarantees block of the documentation's registry page: per command and workflow target, what it
    may remove, truncate or replace, and what makes that safe (one line per call site of the registry)."""
    by_actor: dict[str, list[Entry]] = {}
    for entry in entries:
        for actor in entry.by:
            by_actor.setdefault(actor, []).append(entry)
    lines = [BEGIN, ""]
    for actor in sorted(by_actor):
        lines.append(f"**{actor}**")
        lines.append("")
        for entry in sorted(by_actor[actor], key=lambda e: e.site):
            where = f"{entry.site.file.removeprefix('src/')}:{entry.site.function}"
            lines.append(f"- {entry.what} ({entry.site.call}, `{where}`): {entry.proof}")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)
