"""The package's layers import one way: front ends → workflow → lifecycle → steps → records / store /
conversion → base.

Every import in ``src/ckptflow`` (module level and inside functions) is resolved and checked against the
layer table below; a private module (``_x``) may be imported only from inside its own package. A new
module must be placed in the table, so the architecture is a decision, not an accident.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import REPO

SRC = REPO / "src" / "ckptflow"

BASE, CORE, STEP, LIFECYCLE, WORKFLOW, FRONT = 0, 1, 2, 3, 4, 5
# Top-level names under ckptflow/ and their layer. Core packages (records, store, conversion) stand on
# the base only, side by side: none of them imports another. ``status`` reads the whole life of an
# artifact (it calls archive.verify), so it stands above the steps: no step may import it. ``workflow`` (what
# the Snakefile and its scripts call) stands above the lifecycle, under the face (cli, commands), never importing it.
LAYERS = {
    "__init__": BASE, "errors": BASE, "jsonio": BASE, "fsutil": BASE, "digest": BASE, "progress": BASE,
    "testhooks": BASE, "schemas": BASE, "lock": BASE, "units": BASE,
    "records": CORE, "store": CORE, "conversion": CORE,
    "artifact": STEP, "archive": STEP, "merge": STEP, "materialize": STEP, "trainer": STEP, "status": LIFECYCLE,
    "workflow": WORKFLOW, "cli": FRONT, "commands": FRONT, "__main__": FRONT,
}
# Front ends the library side of the workflow may not lean on: it imports steps and store.open only.
WORKFLOW_MAY_NOT_IMPORT = {"cli", "commands"}


def module_name(path: Path) -> list[str]:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported_modules(path: Path) -> list[tuple[int, list[str]]]:
    """(line, dotted name as a list) of every ckptflow module or name ``path`` imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")) for a in node.names if a.name.split(".")[0] == "ckptflow"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
            else:
                base = node.module.split(".")
            if base[0] != "ckptflow":
                continue
            for alias in node.names:
                found.append((node.lineno, [*base, alias.name]))
    return found


def violations(path: Path) -> list[str]:
    me = module_name(path)
    top = me[1] if len(me) > 1 else "__init__"
    assert top in LAYERS, f"{path}: place the new top-level module {top!r} in LAYERS"
    out = []
    for line, target in imported_modules(path):
        where = f"{path.relative_to(REPO)}:{line} imports {'.'.join(target)}"
        if len(target) < 2 or target[1] == "__version__":
            continue
        other = target[1]
        assert other in LAYERS, f"{where}: unknown top-level name {other!r}"
        if other != top:
            if LAYERS[other] > LAYERS[top]:
                out.append(f"{where}: a lower layer imports a higher one")
            elif LAYERS[other] == LAYERS[top] == CORE:
                out.append(f"{where}: records, store and conversion stand side by side")
            if top == "workflow" and other in WORKFLOW_MAY_NOT_IMPORT:
                out.append(f"{where}: the workflow must not depend on the command line")
        private = [i for i, part in enumerate(target) if part.startswith("_") and not part.startswith("__")]
        if private and target[: private[0]] != me[: private[0]]:
            out.append(f"{where}: a private module of another package")
    return out


def test_every_import_goes_down_the_layers():
    found = [v for path in sorted(SRC.rglob("*.py")) for v in violations(path)]
    assert found == []


@pytest.mark.parametrize("source, expected", [
    ("from ..commands import open_store_from_args\n", "a lower layer imports a higher one"),
    ("from ..records._record import LegacyRecord\n", "a private module of another package"),
    ("from ..conversion import shards\n", "records, store and conversion stand side by side"),
    ("from .s3 import _unsigned\n", "a private module of another package"),  # a private name of another module
])
def test_the_check_catches_a_wrong_way_import(tmp_path, monkeypatch, source, expected):
    fake = SRC / "store" / "zz_layer_probe.py"  # never written: only its path is used
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: source)
    assert any(expected in v for v in violations(fake))


def test_the_check_catches_the_workflow_importing_the_command_line(monkeypatch):
    fake = SRC / "workflow" / "zz_layer_probe.py"  # never written: only its path is used
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: "from ..commands.common import require_extra\n")
    found = violations(fake)
    assert any("a lower layer imports a higher one" in v for v in found)
    assert any("the workflow must not depend on the command line" in v for v in found)


def test_the_check_catches_a_step_that_imports_the_lifecycle_layer(monkeypatch):
    fake = SRC / "archive" / "zz_layer_probe.py"  # never written: only its path is used
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: "from ..status.collect import collect_status\n")
    assert any("a lower layer imports a higher one" in v for v in violations(fake))


# A module over LONGEST lines is split by responsibility, or says at its top why one file is the clearer shape: a
# paragraph of its docstring, the first or the one after the summary line, that starts with REASON.
LONGEST = 500
REASON = "One file because"


def length_violation(path: Path) -> str | None:
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    if lines <= LONGEST:
        return None
    paragraphs = [p.strip() for p in (ast.get_docstring(ast.parse(text)) or "").split("\n\n")]
    if any(p.startswith(REASON) for p in paragraphs[:2]):
        return None
    return (f"{path.relative_to(REPO)}: {lines} lines; split it by responsibility, or say why it is one file in a "
            f"docstring paragraph starting {REASON!r} at its top")


def test_no_module_is_over_500_lines_without_its_reason_at_its_top():
    found = [v for path in sorted(SRC.rglob("*.py")) if (v := length_violation(path))]
    assert found == []


@pytest.mark.parametrize("doc, refused", [
    ('"""Summary."""\n', True),
    ('"""Summary.\n\nSome detail.\n\nOne file because it comes too late."""\n', True),
    ('"""Summary.\n\nOne file because the engine is one."""\n', False),
    ('"""One file because the engine is one: summary."""\n', False),
])
def test_the_length_check_wants_the_reason_at_the_top(monkeypatch, doc, refused):
    fake = SRC / "archive" / "zz_layer_probe.py"  # never written: only its path is used
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: doc + "x = 1\n" * LONGEST)
    assert (length_violation(fake) is not None) == refused
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None: doc + "x = 1\n" * (LONGEST - 10))
    assert length_violation(fake) is None
