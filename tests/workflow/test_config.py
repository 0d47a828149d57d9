"""The workflow configuration and the planning the input functions rely on (records only, no store)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import jsonschema
import pytest
import yaml

from ckptflow.errors import NotFound, Refused, UsageError
from ckptflow.workflow import config as workflow_config
from ckptflow.workflow import triggers
from helpers import REPO
from helpers.artifacts import make_artifact

SCHEMA = json.loads((REPO / "schemas" / "config.schema.json").read_text(encoding="utf-8"))


def _keys(schema: dict, where: str = ""):
    for name, sub in schema.get("properties", {}).items():
        yield f"{where}{name}", sub, name in schema.get("required", [])
        yield from _keys(sub, f"{where}{name}.")
    for pattern, sub in schema.get("patternProperties", {}).items():
        yield from _keys(sub, f"{where}<{pattern}>.")


def test_every_key_has_a_description_and_every_optional_key_a_default():
    keys = list(_keys(SCHEMA))
    assert {"iter", "run", "base", "stage_dir", "teachers_dir", "merge", "materialize",
            "<^[0-9]+$>.mode", "<^[0-9]+$>.experts", "<^[0-9]+$>.lam", "materialize.verify"} <= {
        k.removeprefix("merge.") for k, _, _ in keys}
    for key, sub, required in keys:
        assert sub.get("description"), key
        assert required or "default" in sub, key


def test_config_yaml_holds_every_key_with_the_schema_defaults_and_validates():
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    assert set(config) == set(SCHEMA["properties"])
    for key, sub in SCHEMA["properties"].items():
        assert config[key] == sub["default"], key
    jsonschema.validate(workflow_config.normalise_config(config), SCHEMA)
    readme = (REPO / "config" / "README.md").read_text(encoding="utf-8")
    assert all(f"| `{key}` |" in readme for key in SCHEMA["properties"])


def test_command_line_spellings_are_typed_before_validation():
    raw = {"iter": "iter_000300", "run": "/p/g/r/ts/",
           "merge": {300: {"mode": "tv", "experts": "a.pt, b.pt", "lam": "0.5", "force": "true"}},
           "materialize": {"min_tensors": "1", "expect_tensors": "0", "verify": "false"}}
    config = workflow_config.normalise_config(raw)
    assert config["iter"] == 300 and config["run"] == "p/g/r/ts"
    assert config["merge"] == {"300": {"mode": "tv", "experts": ["a.pt", "b.pt"], "lam": 0.5, "force": True}}
    assert config["materialize"] == {"min_tensors": 1, "expect_tensors": 0, "verify": False}
    jsonschema.validate({**config, "runs_root": "runs"}, SCHEMA)
    assert workflow_config.normalise_config({"iter": 300})["iter"] == 300
    with pytest.raises(UsageError, match="--config iter=300"):
        workflow_config.normalise_config({"iter": "latest"})


def test_a_run_is_resolved_only_when_exactly_one_holds_the_iteration(tmp_path):
    runs = tmp_path / "runs"
    with pytest.raises(UsageError) as none:
        workflow_config.resolve_run(runs, 300, None)
    assert "--config run=" in str(none.value) + (none.value.remedy or "")
    make_artifact(runs / "p" / "g" / "a" / "ts1", iteration=300)
    interrupted = runs / "p" / "g" / "b" / "ts1" / "checkpoint_artifacts" / "iter_000300"
    interrupted.mkdir(parents=True)  # no manifest: not a candidate
    assert workflow_config.resolve_run(runs, 300, None) == ("p/g/a/ts1", "iter_000300")
    make_artifact(runs / "p" / "g" / "c" / "ts2", iteration=300)
    with pytest.raises(UsageError) as several:
        workflow_config.resolve_run(runs, 300, None)
    assert "p/g/a/ts1" in several.value.message and "p/g/c/ts2" in several.value.message
    assert "--config run=" in several.value.remedy
    assert workflow_config.resolve_run(runs, 300, "p/g/c/ts2/") == ("p/g/c/ts2", "iter_000300")
    assert workflow_config.resolve_run(runs, 400, "p/g/new/ts") == ("p/g/new/ts", "iter_000400")
    padded = runs / "p" / "g" / "d" / "ts" / "checkpoint_artifacts" / "iter_0000300"
    padded.mkdir(parents=True)
    assert workflow_config.resolve_run(runs, 300, "p/g/d/ts") == ("p/g/d/ts", "iter_0000300")


def _receipt(art: Path, prefix: str) -> None:
    """A receipt bound to ``art`` as publication binds it: it records the digest of art's manifest."""
    manifest = (art / ".posttrain-checkpoint-artifact.json").read_bytes()
    (art / ".uploaded").write_text(json.dumps({
        "protocol": "posttrain.archive-marker.v1",
        "destination": {"scheme": "s3", "endpoint": "127.0.0.1:18333", "bucket": "ckpts", "prefix": prefix},
        "declaration_sha256": "0" * 64, "files": [
            {"path": ".posttrain-checkpoint-artifact.json", "sha256": hashlib.sha256(manifest).hexdigest(),
             "size": len(manifest)},
            {"path": "model.pt", "sha256": "1" * 64, "size": 3}],
        "uploaded_at": "2026-11-29T00:00:00Z"}), encoding="utf-8")


def test_the_teacher_source_is_local_while_the_payload_is_there_else_the_archive_its_receipt_names(tmp_path):
    art = make_artifact(tmp_path / "runs" / "r", iteration=300)
    assert triggers.teacher_source(art, "r", bucket="ckpts", has_recipe=False).kind == "local"
    assert triggers.teacher_source(art, "r", bucket="ckpts", has_recipe=True).kind == "merge"
    with open(art / "model.pt", "ab") as fh:
        fh.write(b"x")  # the size no longer matches the manifest
    with pytest.raises(NotFound, match="no receipt"):
        triggers.teacher_source(art, "r", bucket="ckpts", has_recipe=False)
    _receipt(art, "r/checkpoint_artifacts/iter_000300")
    source = triggers.teacher_source(art, "r", bucket="other", has_recipe=True)
    assert (source.kind, source.uri) == ("archive", "s3://ckpts/r/checkpoint_artifacts/iter_000300")
    (art / "model.pt").unlink()
    assert triggers.teacher_source(art, "r", bucket=None, has_recipe=False).kind == "archive"
    (art / ".uploaded").write_text("uploaded 2024-01-01\n", encoding="utf-8")
    with pytest.raises(Refused, match="legacy"):
        triggers.teacher_source(art, "r", bucket="ckpts", has_recipe=False)


def test_without_a_local_directory_the_teacher_comes_from_the_configured_bucket(tmp_path, monkeypatch):
    missing = tmp_path / "runs" / "p" / "g" / "r" / "ts" / "checkpoint_artifacts" / "iter_000300"
    source = triggers.teacher_source(missing, "p/g/r/ts", bucket="file:///arch/", has_recipe=False)
    assert (source.kind, source.uri) == ("archive", "file:///arch/p/g/r/ts/checkpoint_artifacts/iter_000300")
    monkeypatch.setenv("CKPTFLOW_BUCKET", "ckpts")
    assert triggers.teacher_source(missing, "p/g/r/ts", bucket=None, has_recipe=False).uri == (
        "s3://ckpts/p/g/r/ts/checkpoint_artifacts/iter_000300")
    assert triggers.teacher_source(missing, "p/g/r/ts", bucket=None, has_recipe=True).kind == "merge"
    missing.mkdir(parents=True)
    (missing / "model.pt").write_bytes(b"an interrupted save")
    with pytest.raises(NotFound, match="not a committed artifact"):
        triggers.teacher_source(missing, "p/g/r/ts", bucket="ckpts", has_recipe=False)


def test_the_status_fingerprint_moves_with_records_only(tmp_path):
    roots = [tmp_path / d for d in ("runs", "reports", "stage", "teachers")]
    art = make_artifact(roots[0] / "r", iteration=300)
    first = triggers.records_fingerprint(*roots)
    (art / "notes.txt").write_text("unrelated", encoding="utf-8")
    (roots[1]).mkdir()
    (roots[1] / "status.json").write_text("{}", encoding="utf-8")  # the table itself is not an input
    assert triggers.records_fingerprint(*roots) == first
    (roots[1] / "verify" / "r").mkdir(parents=True)
    (roots[1] / "verify" / "r" / "iter_000300.json").write_text("{}", encoding="utf-8")
    second = triggers.records_fingerprint(*roots)
    assert second != first
    os.utime(art / ".posttrain-checkpoint-artifact.json", ns=(1, 1))
    assert triggers.records_fingerprint(*roots) != second


def test_a_failing_step_leaves_its_error_in_the_rule_log(tmp_path):
    import logging
    import sys

    from ckptflow.errors import Refused
    from ckptflow.workflow.steps import step_log

    log, stderr = tmp_path / "step.log", sys.stderr
    with pytest.raises(Refused), step_log(str(log)):
        logging.getLogger("ckptflow.test").info("starting")
        raise Refused("teacher dir holds NOTES.md", remedy="move it out")
    text = log.read_text()
    assert "starting" in text and "Refused: teacher dir holds NOTES.md" in text
    assert sys.stderr is stderr
