"""Strict JSON for records: the one decoder and the one encoder every record, sidecar and report uses.

Decoding is strict UTF-8 (a byte-order mark is refused by name), rejects NaN/Infinity and duplicate
keys, and requires a JSON object at the top level. Encoding is deterministic: sorted keys, UTF-8,
no NaN, a trailing newline, so equal content gives equal bytes and a stable digest.
Schemas are loaded from the package (``ckptflow/schemas``, which the checkout's ``schemas/`` points to),
so a checkout and an installed wheel validate against the same single copy.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from .errors import InvalidRecord, NotFound

_BOM = b"\xef\xbb\xbf"


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not valid JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def decode_json_object(data: bytes, *, what: str) -> dict[str, Any]:
    """Decode ``data`` as one JSON object or raise ``InvalidRecord`` naming ``what``."""
    if data.startswith(_BOM):
        raise InvalidRecord(f"{what} starts with a UTF-8 byte-order mark", remedy="rewrite it as UTF-8 without BOM")
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise InvalidRecord(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        obj = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_no_duplicates)
    except ValueError as exc:
        raise InvalidRecord(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidRecord(f"{what} must hold a JSON object at the top level, found {type(obj).__name__}")
    return obj


def read_json_object(path: Path | str, *, what: str | None = None) -> dict[str, Any]:
    path = Path(path)
    label = what or str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"{label} does not exist", path=str(path)) from None
    return decode_json_object(data, what=label)


def encode_json(obj: Any) -> bytes:
    """Deterministic bytes: sorted keys, compact-but-readable indentation, UTF-8, trailing newline."""
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


@cache
def load_schema(name: str) -> dict[str, Any]:
    """Load ``schemas/<name>.schema.json`` from the installed package."""
    ref = resources.files("ckptflow").joinpath("schemas", f"{name}.schema.json")
    return json.loads(ref.read_text(encoding="utf-8"))


# A reference to a whole schema file beside the referring one: a part several schemas share.
_SHARED_REF = re.compile(r"[a-z0-9_]+\.schema\.json")


@cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    schema = load_schema(name)
    cls = jsonschema.validators.validator_for(schema)
    # No check_schema here: the schemas are package data, each checked against its metaschema by
    # tests/records/test_records_schemas.py; checking them again in every process cost a verb 0.08 CPU-s.
    return cls(_inline_local_refs(schema, schema.get("$defs", {})))


def _inline_local_refs(node: Any, defs: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """``node`` with each ``{"$ref": "#/$defs/X"}`` replaced by X itself (the same constraints): resolving
    references on every validation was most of the cost of reading a thousand records. A recursive
    definition keeps its reference. ``{"$ref": "NAME.schema.json"}`` is a part several schemas share
    (one file beside them, such as ``credentials_source``), inlined the same way."""
    if isinstance(node, list):
        return [_inline_local_refs(v, defs, seen) for v in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and _SHARED_REF.fullmatch(ref) and ref not in seen:
        shared = load_schema(ref.removesuffix(".schema.json"))
        body = {k: v for k, v in shared.items() if k not in ("$schema", "$id", "$defs", "title")}
        target = _inline_local_refs(body, shared.get("$defs", {}), (*seen, ref))
        rest = {k: _inline_local_refs(v, defs, seen) for k, v in node.items() if k != "$ref"}
        return {"allOf": [target, rest]} if rest else target
    if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[8:] in defs and ref[8:] not in seen:
        name = ref[8:]
        target = _inline_local_refs(defs[name], defs, (*seen, name))
        rest = {k: _inline_local_refs(v, defs, seen) for k, v in node.items() if k != "$ref"}
        return {"allOf": [target, rest]} if rest else target
    return {k: _inline_local_refs(v, defs, seen) for k, v in node.items()}


def validate(obj: Any, schema_name: str, *, what: str) -> None:
    """Validate against a named schema; the error names the record, the field path and the problem."""
    errors = sorted(_validator(schema_name).iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise InvalidRecord(f"{what} fails schema {schema_name} at {where}: {err.message}{more}")
