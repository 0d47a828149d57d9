"""``make demo``'s workflow configuration stays valid and names what ``demo/build_run.py`` writes.

A fast check beside the end-to-end run in ``test_demo.py``: it catches a configuration key renamed in the
schema, or an expert path the builder no longer writes, without running the demo.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jsonschema
import yaml

from ckptflow.workflow import config as workflow
from helpers import REPO

DEMO_ROOT = Path(".ckptflow/demo")  # demo/demo.sh builds the run here, relative to the checkout


def _load_builder():
    spec = importlib.util.spec_from_file_location("demo_build_run", REPO / "demo" / "build_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _demo_config() -> dict:
    """config/config.yaml overlaid with demo/config.yaml, as ``--configfile demo/config.yaml`` does."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    demo = yaml.safe_load((REPO / "demo" / "config.yaml").read_text(encoding="utf-8"))
    for key, value in demo.items():
        if isinstance(value, dict) and isinstance(config.get(key), dict):
            config[key] = {**config[key], **value}
        else:
            config[key] = value
    return workflow.normalise_config(config)


def test_demo_config_validates_against_the_workflow_schema():
    schema = json.loads((REPO / "schemas" / "config.schema.json").read_text(encoding="utf-8"))
    config = _demo_config()
    jsonschema.validate(config, schema)
    for key in ("runs_root", "reports_dir", "logs_dir", "base", "stage_dir", "teachers_dir", "credentials"):
        assert Path(config[key]).parts[:2] == DEMO_ROOT.parts, (key, config[key])


def test_demo_merge_recipe_names_the_experts_the_builder_writes():
    build_run = _load_builder()
    config = _demo_config()
    recipe = workflow.merge_recipe(config, 300)
    assert recipe is not None and recipe["mode"] == "tv"
    expected = [
        str(build_run.artifact_dir(DEMO_ROOT, f"demo/experts/{name}", build_run.EXPERT_ITER) / "model.pt")
        for name in build_run.CORPUS
    ]
    assert recipe["experts"] == expected
    assert config["base"] == str(DEMO_ROOT / "base")
    assert config["runs_root"] == str(DEMO_ROOT / "runs")
    script = (REPO / "demo" / "demo.sh").read_text(encoding="utf-8")
    assert f"TS={build_run.TS}\n" in script
    assert f"for expert in {' '.join(build_run.CORPUS)}; do" in script
