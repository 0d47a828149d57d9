"""Every schema ships with the package, is a valid draft 2020-12 schema, and documents every field."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest

from ckptflow.jsonio import load_schema

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
RECORD_SCHEMAS = [
    "manifest",
    "declaration",
    "receipt",
    "merge_record",
    "staging",
    "materialized",
    "legacy_manifest",
    "probe",
    "merge_progress",
]
PACKAGED = sorted(
    p.name.removesuffix(".schema.json")
    for p in resources.files("ckptflow").joinpath("schemas").iterdir()
    if p.name.endswith(".schema.json")
)


def test_every_record_schema_ships_in_the_package():
    assert set(RECORD_SCHEMAS) <= set(PACKAGED)


def test_checkout_schemas_folder_is_the_package_copy():
    checkout = Path(__file__).resolve().parents[2] / "schemas"
    packaged = Path(str(resources.files("ckptflow").joinpath("schemas")))
    if not checkout.exists():
        pytest.skip("running outside a checkout")
    assert checkout.resolve() == packaged.resolve()


@pytest.mark.parametrize("name", PACKAGED)
def test_schema_loads_and_is_valid_draft_2020_12(name):
    schema = load_schema(name)
    assert schema["$schema"] == DRAFT_2020_12
    jsonschema.Draft202012Validator.check_schema(schema)
    assert jsonschema.validators.validator_for(schema) is jsonschema.Draft202012Validator


def _object_schemas(node, where="#"):
    if isinstance(node, dict):
        if "properties" in node:
            yield where, node
        for key, child in node.items():
            yield from _object_schemas(child, f"{where}/{key}")
    elif isinstance(node, list):
        for i, child in enumerate(node):
            yield from _object_schemas(child, f"{where}/{i}")


@pytest.mark.parametrize("name", RECORD_SCHEMAS)
def test_every_property_has_a_description(name):
    schema = load_schema(name)
    assert schema.get("description")
    missing = [
        f"{where}/{prop}"
        for where, obj in _object_schemas(schema)
        for prop, sub in obj["properties"].items()
        if "description" not in sub and not where.endswith("/if")
    ]
    assert missing == []


@pytest.mark.parametrize("name", RECORD_SCHEMAS)
def test_every_closed_object_refuses_unknown_fields(name):
    schema = load_schema(name)
    # "if" conditions and the manifest's component dispatcher only select a closed branch.
    open_objects = [
        where
        for where, obj in _object_schemas(schema)
        if obj.get("additionalProperties") is not False and not where.endswith(("/if", "/component"))
    ]
    assert open_objects == []


def test_file_entry_definition_is_identical_in_every_schema():
    definitions = {
        n: load_schema(n)["$defs"]["fileEntry"]
        for n in RECORD_SCHEMAS
        if "fileEntry" in load_schema(n).get("$defs", {})
    }
    assert len(definitions) == 6
    first = next(iter(definitions.values()))
    assert all(d == first for d in definitions.values())
    assert first["properties"]["sha256"]["pattern"] == "^[0-9a-f]{64}$"
    assert first["properties"]["size"]["minimum"] == 0


def test_schema_files_are_plain_utf8_json():
    root = resources.files("ckptflow").joinpath("schemas")
    for name in RECORD_SCHEMAS:
        raw = root.joinpath(f"{name}.schema.json").read_bytes()
        assert not raw.startswith(b"\xef\xbb\xbf")
        assert json.loads(raw.decode("utf-8")) == load_schema(name)
