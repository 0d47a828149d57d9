"""The light core: the archive verbs import no torch, transformers or snakemake, and a verb whose optional
dependencies are missing exits 2 with one line naming the extra (``pip install 'ckptflow[convert]'``).

Each check runs a fresh interpreter (the test process itself may have imported anything). Where a heavy
package is installed (the 3.11 suite) it is blocked in the child with ``sys.modules[name] = None``, which
makes its import fail exactly as when it is absent; in the core legs of ``make test`` it is truly absent.
This file imports nothing heavy, so the core legs collect it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from helpers import REPO

HEAVY = ("torch", "transformers", "snakemake", "safetensors", "tokenizers", "PIL", "numpy")
# Every module the core verbs (seal, probe, publish, verify, prune-verified, fetch, status, resume-check,
# retain-checkpoints) and the trainer API reach (its write functions import torch when called); the steps of the [convert] extra (merge/, conversion/, materialize/) are left out on purpose.
CORE_MODULES = (
    "ckptflow", "ckptflow.cli", "ckptflow.artifact", "ckptflow.trainer", "ckptflow.workflow.plan", "ckptflow.workflow.steps", "ckptflow.archive",
    "ckptflow.archive.publish", "ckptflow.archive.fetch", "ckptflow.archive.verify", "ckptflow.archive.prune",
    "ckptflow.archive.probe", "ckptflow.records", "ckptflow.store", "ckptflow.store.open", "ckptflow.store.s3",
    "ckptflow.store.gcs", "ckptflow.store.local", "ckptflow.status", "ckptflow.commands.seal",
    "ckptflow.commands.publish", "ckptflow.commands.verify", "ckptflow.commands.prune_verified",
    "ckptflow.commands.fetch", "ckptflow.commands.probe", "ckptflow.commands.status",
    "ckptflow.commands.resume_check", "ckptflow.commands.retain_checkpoints", "ckptflow.trainer.retention",
    "ckptflow.trainer.resume", "ckptflow.trainer.write", "ckptflow.trainer.publish", "ckptflow.commands.merge", "ckptflow.commands.materialize",
    "ckptflow.commands.gc_uploads", "ckptflow.store.s3_uploads",
)

_CHILD = """
import contextlib, importlib, io, json, sys
block, modules, argv, heavy = (json.loads(a) for a in sys.argv[1:5])
for name in block:
    sys.modules[name] = None  # blocked: importing it raises ModuleNotFoundError, as when it is absent
for module in modules:
    importlib.import_module(module)
from ckptflow.cli import main
result = {}
if argv:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result["code"] = main(argv)
        except SystemExit as exc:
            result["code"] = exc.code
    result.update(stdout=out.getvalue(), stderr=err.getvalue())
result["loaded"] = sorted(m for m in heavy if sys.modules.get(m) is not None)
sys.stdout.write(json.dumps(result))
"""


def _child(argv: list[str], *, block: tuple[str, ...] = (), modules: tuple[str, ...] = ()) -> dict:
    args = [json.dumps(x) for x in (block, modules, argv, HEAVY)]
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_core_modules_and_publish_help_load_no_torch_transformers_or_snakemake():
    result = _child(["publish", "--help"], modules=CORE_MODULES)
    assert result["code"] == 0 and "--upload-prefix" in result["stdout"], result
    assert result["loaded"] == [], f"the core imported {result['loaded']}"


@pytest.mark.parametrize("verb", ["seal", "probe", "publish", "verify", "prune-verified", "fetch", "status",
                                  "merge", "materialize", "resume-check", "retain-checkpoints", "gc-uploads"])
def test_every_verbs_help_loads_nothing_heavy(verb):
    result = _child([verb, "--help"])
    assert result["code"] == 0 and result["stdout"].startswith("usage: ckptflow"), result
    assert result["loaded"] == [], f"`ckptflow {verb} --help` imported {result['loaded']}"


@pytest.mark.parametrize("blocked", [("torch",), ("transformers", "tokenizers"), HEAVY])
@pytest.mark.parametrize("verb, args", [
    ("merge", ["--mode", "avg", "--experts", "a/model.pt,b/model.pt", "--out", "x/iter_000001/model.pt"]),
    ("materialize", ["--ckpt-dir", "x/iter_000001", "--base", "base", "--out", "teacher"]),
])
def test_a_verb_without_its_extra_exits_2_with_one_line_naming_it(tmp_path, verb, args, blocked):
    result = _child([verb, *args], block=blocked)
    assert result["code"] == 2, result
    lines = result["stderr"].splitlines()
    assert len(lines) == 1 and "Traceback" not in result["stderr"], result["stderr"]
    assert lines[0].startswith(f"ckptflow {verb}: missing extra: "), lines[0]
    assert "pip install 'ckptflow[convert]'" in lines[0] and blocked[0] in lines[0], lines[0]
    if "PIL" in blocked:  # named by the package to install, not its import name
        assert "pillow" in lines[0] and "PIL" not in lines[0], lines[0]
    report = json.loads(result["stdout"])
    assert report["status"] == "usage-error" and report["error"]["type"] == "MissingExtra", report
    assert result["loaded"] == [], f"the check imported {result['loaded']} before refusing"


def test_an_extra_module_missing_deeper_in_a_verb_is_still_one_line_naming_the_extra(monkeypatch, capsys):
    from ckptflow import cli
    from ckptflow.commands import merge

    def run(args):
        raise ModuleNotFoundError("No module named 'safetensors'", name="safetensors")

    monkeypatch.setattr(merge, "run", run)
    code = cli.main(["merge", "--mode", "avg", "--experts", "a", "--out", "x/iter_000001/model.pt"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.splitlines() == [
        "ckptflow merge: missing extra: merge needs the optional dependencies of ckptflow[convert] and "
        "safetensors is not installed; install them with: pip install 'ckptflow[convert]'"
    ]


def test_a_module_missing_that_no_extra_provides_is_not_disguised(monkeypatch):
    from ckptflow import cli
    from ckptflow.commands import merge

    def run(args):
        raise ModuleNotFoundError("No module named 'ckptflow.nowhere'", name="ckptflow.nowhere")

    monkeypatch.setattr(merge, "run", run)
    with pytest.raises(ModuleNotFoundError, match=r"ckptflow\.nowhere"):
        cli.main(["merge", "--mode", "avg", "--experts", "a", "--out", "x/iter_000001/model.pt"])


def _pins(lines) -> dict[str, str]:
    pins = {}
    for line in lines:
        line = line.split("#", 1)[0].strip().removeprefix("- ")
        if "==" in line:
            name, version = line.split("==", 1)
            pins[re.sub(r"\[.*\]", "", name).strip().lower()] = version.strip()
    return pins


def test_the_lock_satisfies_every_declared_range_and_environment_yml_mirrors_it():
    from packaging.requirements import Requirement

    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib; the 3.11 suite checks the lock")
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    lock = _pins((REPO / "constraints.txt").read_text(encoding="utf-8").splitlines())
    declared = [Requirement(r) for r in project["dependencies"]]
    declared += [Requirement(r) for name, reqs in project["optional-dependencies"].items() if name != "all" for r in reqs]
    for req in declared:
        assert req.name.lower() in lock, f"constraints.txt pins no {req.name}"
        assert req.specifier.contains(lock[req.name.lower()], prereleases=True), (
            f"constraints.txt pins {req.name}=={lock[req.name.lower()]}, outside pyproject's {req}")
    assert lock["torch"] == "2.13.0"
    assert project["optional-dependencies"]["all"] == ["ckptflow[convert,hf,workflow]"]
    mirrored = _pins((REPO / "environment.yml").read_text(encoding="utf-8").splitlines())
    assert set(mirrored) == {r.name.lower() for r in declared}, "environment.yml lists the direct dependencies"
    assert {n: v for n, v in mirrored.items() if lock[n] != v} == {}, "environment.yml differs from constraints.txt"


@pytest.mark.slow
def test_make_dist_builds_a_wheel_of_the_tracked_package_with_its_schemas_and_command(tmp_path):
    """No package index holds ckptflow yet: the README installs it from a checkout or from this wheel. The
    wheel holds exactly the tracked modules and schemas of the package (it is built from a copy of what git
    tracks, so nothing left in the checkout's own directories reappears) and the ``ckptflow`` command."""
    import zipfile

    out = subprocess.run(["make", "--no-print-directory", "dist", f"DIST={tmp_path}"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (wheel,) = tmp_path.glob("ckptflow-*-py3-none-any.whl")
    tracked = subprocess.run(["git", "ls-files", "src/ckptflow"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.split()
    expected = {p.removeprefix("src/") for p in tracked if p.endswith((".py", ".json"))}
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        packaged = {n for n in names if n.startswith("ckptflow/")}
        entry_points = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert packaged == expected
    assert any(n.startswith("ckptflow/schemas/") for n in packaged)
    assert "ckptflow = ckptflow.cli:main" in entry_points
