"""``.posttrain-checkpoint-artifact.legacy.json``: the original bytes of a converted legacy merge manifest.

When the publisher converts a legacy merge manifest into a native ``.posttrain-checkpoint-artifact.json``
it keeps the original beside it, byte for byte, so the conversion can be audited or redone::

    iter_0000300/
    ├── .posttrain-checkpoint-artifact.json          the native manifest (converted)
    └── .posttrain-checkpoint-artifact.legacy.json   this record: the original bytes, never re-encoded

Its only format rule is that it is one strict JSON object (UTF-8 without BOM, no NaN, no duplicate keys).
"""

from __future__ import annotations

from pathlib import Path

from .. import fsutil
from ..jsonio import decode_json_object, validate
from . import _record

FILENAME = ".posttrain-checkpoint-artifact.legacy.json"

KIND = _record.RecordKind(filename=FILENAME, schema="legacy_manifest", protocol=None)
path_in = KIND.path_in


def check_legacy_manifest(data: bytes, *, what: str = FILENAME) -> bytes:
    """Return ``data`` unchanged after checking that it is one strict JSON object."""
    validate(decode_json_object(data, what=what), KIND.schema, what=what)
    return data


def read_legacy_manifest(source: Path | str) -> bytes:
    """The original bytes, after checking they still decode as one JSON object."""
    return _record.read_record(KIND, source, check_legacy_manifest)


def write_legacy_manifest(directory: Path | str, original_bytes: bytes) -> Path:
    """Write ``original_bytes`` verbatim (atomically) once they are known to be one JSON object."""
    path = path_in(directory)
    check_legacy_manifest(original_bytes, what=_record.record_label(path, FILENAME))
    fsutil.atomic_write_bytes(path, bytes(original_bytes))
    return path
