"""Helpers for the workflow tests: Snakemake driven as a subprocess on a per-test configuration."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from helpers import REPO, preloaded

SNAKEMAKE = Path(sys.executable).with_name("snakemake")
RUN = "proj/grp/run1/20261129T000000Z"
NOTHING = "Nothing to be done"
WORKFLOW_FILES = ("Snakefile", "rules", "scripts", "config", "schemas", "profiles", "environment.yml")


def copy_workflow(dest: Path) -> Path:
    """A copy of the workflow (Snakefile, rules/, scripts/, config/, schemas/, profiles/), as an operator's
    second checkout: a test may touch its scripts or run it beside the repository's own."""
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=False)
        else:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def snakemake(workdir: Path, *args: str, config: dict[str, str], env: dict[str, str],
              configfile: Path | None = None, workflow: Path = REPO) -> subprocess.CompletedProcess:
    """``snakemake ARGS`` on the Snakefile of ``workflow`` (the repository's) in ``workdir``, with
    ``--config`` overrides: a process forked from one that has imported Snakemake already
    (tests/helpers/preloaded.py)."""
    cfg = [f"{k}={v}" for k, v in config.items()]
    files = [str(workflow / "config" / "config.yaml"), *([str(configfile)] if configfile else [])]
    return preloaded.snakemake(
        [str(SNAKEMAKE), "-s", str(workflow / "Snakefile"), "-d", str(workdir), "--configfile", *files,
         "--cores", "2", *args, *(["--config", *cfg] if cfg else [])],
        timeout=600, env={**os.environ, **env},
    )


@dataclass
class Flow:
    """One workflow directory: its configuration file (rewritten before each run) and environment."""

    root: Path
    config: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    workflow: Path = REPO  # the checkout whose Snakefile runs (copy_workflow makes another)

    def __post_init__(self) -> None:
        r = self.root
        self.config = {
            "runs_root": str(r / "runs"), "reports_dir": str(r / "reports"), "logs_dir": str(r / "logs"),
            "stage_dir": str(r / "stage"), "teachers_dir": str(r / "teachers"), **self.config,
        }
        self.env = {"CKPTFLOW_CACHE_DIR": str(r / "cache"), "CKPTFLOW_PROGRESS": "0", **self.env}

    @property
    def runs(self) -> Path:
        return Path(self.config["runs_root"])

    def artifact(self, iteration: int = 300, run: str = RUN) -> Path:
        return self.runs / run / "checkpoint_artifacts" / f"iter_{iteration:06d}"

    def report(self, kind: str, iteration: int = 300, run: str = RUN) -> Path:
        return Path(self.config["reports_dir"]) / kind / run / f"iter_{iteration:06d}.json"

    def teacher(self, iteration: int = 300, run: str = RUN) -> Path:
        return Path(self.config["teachers_dir"]) / run / f"iter_{iteration:06d}"

    def staged(self, iteration: int = 300, run: str = RUN) -> Path:
        return Path(self.config["stage_dir"]) / run / f"iter_{iteration:06d}"

    def run(self, *args: str, kill_at: str | None = None, **overrides) -> subprocess.CompletedProcess:
        """Run Snakemake; ``overrides`` go on the command line (``iter=300`` arrives as an int there)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / "test-config.yaml"
        path.write_text(json.dumps(self.config, indent=1), encoding="utf-8")  # YAML reads JSON
        env = {**self.env, **({"CKPTFLOW_TEST_KILL_AT": kill_at} if kill_at else {})}
        return snakemake(self.root, *args, config={k: str(v) for k, v in overrides.items()}, env=env, configfile=path,
                         workflow=self.workflow)

    def ok(self, *args: str, **overrides) -> str:
        """Run and require success; the combined output."""
        done = self.run(*args, **overrides)
        out = done.stdout + done.stderr
        assert done.returncode == 0, out
        return out

    def fails(self, *args: str, kill_at: str | None = None, **overrides) -> str:
        done = self.run(*args, kill_at=kill_at, **overrides)
        out = done.stdout + done.stderr
        assert done.returncode != 0, out
        return out

    def planned(self, *args: str, **overrides) -> list[str]:
        """The rules a dry run would execute (``rule NAME:`` blocks), in order; [] when nothing is to be done."""
        out = self.ok("-n", *args, **overrides)
        rules = [line.split()[-1].rstrip(":") for line in out.splitlines() if line.startswith(("rule ", "localrule "))]
        assert rules or NOTHING in out, out
        return rules

    def nothing_planned(self, *targets: str, **overrides) -> None:
        """Require that a dry run of ``targets`` executes nothing, in one Snakemake process rather than one per
        target: the plan for several targets is the union of each one's, so it is empty only when each is."""
        plan = self.planned(*targets, **overrides)
        assert plan == [], (targets, plan)

    def log_of(self, kind: str, iteration: int = 300, run: str = RUN) -> str:
        path = Path(self.config["logs_dir"]) / kind / run / f"iter_{iteration:06d}.log"
        return path.read_text(encoding="utf-8") if path.exists() else ""


@dataclass(frozen=True)
class Snapshot:
    """A workflow directory's state, built once and handed to each test as its own copy: records hold
    absolute paths, so the copy goes back where the state was built (``root``: the flow's directory, or one
    above it that also holds a checkout or archives). The tests sharing one form an xdist group (they run one
    after another on one worker, which builds it once); each starts by ``restore()``, which replaces the
    previous test's copy with the saved state (mtimes kept: Snakemake's rerun triggers read them; symlinks
    stay links)."""

    root: Path
    saved: Path
    flow: Path
    config: dict
    workflow: Path = REPO

    @classmethod
    def take(cls, flow: Flow, saved: Path, root: Path | None = None) -> Snapshot:
        root = root or flow.root
        shutil.copytree(root, saved, symlinks=True)
        return cls(root, saved, flow.root, copy.deepcopy(flow.config), flow.workflow)

    def restore(self) -> Flow:
        if self.root.exists():
            shutil.rmtree(self.root)
        shutil.copytree(self.saved, self.root, symlinks=True)
        return Flow(self.flow, copy.deepcopy(self.config), workflow=self.workflow)
