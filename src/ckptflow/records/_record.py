"""The pattern every record module shares: locate, read, check protocol, validate, encode, write.

A record module declares a ``RecordKind`` (file name, schema name, protocol) and a frozen dataclass
whose ``from_dict(data, what=...)`` calls ``check_object`` and then does its semantic checks, then binds
the two in a ``RecordFile`` whose methods are the module's ``parse_*``, ``read_*``, ``encode_*`` and
``write_*`` (``path_in`` is the kind's). Reading, parsing remote bytes, encoding and writing all go through that one
``from_dict``, so a record is checked by the same code when it is written and when it is read back.

The protocol is checked by name *before* the schema, so a record from a newer or older tool is
refused with a message that says which protocol was found and what to do, instead of a schema error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import urlsplit

from .. import fsutil
from ..digest import is_sha256_hex
from ..errors import InvalidRecord, NotFound
from ..jsonio import decode_json_object, encode_json, validate

T = TypeVar("T")
R = TypeVar("R", bound="_Record")

_VERSIONED = re.compile(r"^(?P<family>.+)\.v(?P<version>[0-9]+)$")
_UTC_TIMESTAMP = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?(Z|\+00:00)$"
)
# An endpoint is an authority (host[:port]) or an archive root path; these characters only appear
# in userinfo (user:secret@host), query strings (?X-Amz-Signature=...) and fragments.
_SECRET_MARKERS = ("@", "?", "#")


class LegacyRecord(InvalidRecord):
    """A well-formed JSON record written by an older tool (no protocol, or an older version of it)."""


@dataclass(frozen=True, slots=True)
class RecordKind:
    filename: str
    schema: str
    protocol: str | None
    protocol_key: str = "protocol"
    legacy_remedy: str = "it was written by an older tool; rewrite it with this ckptflow"
    # Runs before the schema, for checks whose schema error would echo a value that must never be
    # printed (an endpoint that carries a credential).
    precheck: Callable[[Mapping[str, Any], str], None] | None = None

    def path_in(self, directory: Path | str) -> Path:
        """Where this record lives in ``directory``."""
        return Path(directory) / self.filename


class Flat:
    """Base of a flat record part whose JSON object is exactly its fields, by name (no protocol, no
    nesting): one ``to_dict`` instead of a hand-written copy of the field list that can drift from it."""

    __slots__ = ()

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]


class _Record(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def record_path(source: Path | str, filename: str) -> Path:
    """``source`` is the directory holding the record or the record file itself."""
    path = Path(source)
    return path / filename if path.is_dir() else path


def record_label(path: Path, filename: str) -> str:
    """How messages name a record: "`.uploaded` in /run/iter_5", or the full path for other names."""
    if path.name == filename:
        return f"`{filename}` in {path.parent}"
    return str(path)


def check_protocol(kind: RecordKind, obj: Mapping[str, Any], what: str) -> None:
    if kind.protocol is None:
        return
    key = kind.protocol_key
    if key not in obj:
        raise LegacyRecord(
            f"{what} has no {key!r} field (expected {kind.protocol!r})", remedy=kind.legacy_remedy
        )
    found = obj[key]
    if found == kind.protocol:
        return
    if not isinstance(found, str):
        raise InvalidRecord(
            f"{what} has {key} {found!r}, which is not a string; this ckptflow reads {kind.protocol!r}"
        )
    message = f"{what} has {key} {found!r}, this ckptflow reads {kind.protocol!r}"
    ours, theirs = _VERSIONED.match(kind.protocol), _VERSIONED.match(found)
    if ours and theirs and ours["family"] == theirs["family"]:
        if int(theirs["version"]) > int(ours["version"]):
            raise InvalidRecord(message, remedy="upgrade ckptflow")
        raise LegacyRecord(message, remedy=kind.legacy_remedy)
    raise InvalidRecord(
        message, remedy=f"the file is not a {kind.filename} record; it is corrupt or from another tool"
    )


def check_object(kind: RecordKind, obj: Any, what: str) -> None:
    """Protocol by name, then the schema. Raises ``InvalidRecord`` naming ``what``."""
    if not isinstance(obj, Mapping):
        raise InvalidRecord(f"{what} must be a JSON object, found {type(obj).__name__}")
    if kind.precheck is not None:
        kind.precheck(obj, what)
    check_protocol(kind, obj, what)
    validate(dict(obj), kind.schema, what=what)


def read_bytes(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"{what} does not exist", path=str(path)) from None
    except IsADirectoryError:
        raise InvalidRecord(f"{what} is a directory, not a record file", path=str(path)) from None


def read_record(kind: RecordKind, source: Path | str, parse: Callable[..., T]) -> T:
    """Read ``kind.filename`` in ``source`` (or the file ``source``) and hand its bytes to ``parse``."""
    path = record_path(source, kind.filename)
    what = record_label(path, kind.filename)
    return parse(read_bytes(path, what), what=what)


def encode_record(record: _Record, *, what: str) -> bytes:
    """Deterministic bytes of ``record`` after the checks a reader would run on them."""
    data = record.to_dict()
    type(record).from_dict(data, what=what)  # type: ignore[attr-defined]
    return encode_json(data)


def write_record(kind: RecordKind, path: Path, record: _Record) -> Path:
    """Validate, then write atomically: readers see the old record or the complete new one."""
    data = encode_record(record, what=record_label(path, kind.filename))
    fsutil.atomic_write_bytes(path, data)
    return path


@dataclass(frozen=True)
class RecordFile(Generic[R]):
    """One record file bound to its dataclass: the module-level functions every record module exports.

    ``label`` names bytes that were not read from a path (what ``encode`` checks; default the file name);
    ``parse_what`` is the default name ``parse`` gives its bytes (default ``label``; "remote ..." for
    records that are fetched from an archive).
    """

    kind: RecordKind
    record: type[R]
    label: str = ""
    parse_what: str = ""

    def parse(self, data: bytes, *, what: str = "") -> R:
        what = what or self.parse_what or self.label or self.kind.filename
        return self.record.from_dict(decode_json_object(data, what=what), what=what)  # type: ignore[attr-defined]

    def read(self, source: Path | str) -> R:
        """Read the record in directory ``source`` (or the record file ``source``)."""
        return read_record(self.kind, source, self.parse)

    def encode(self, record: R) -> bytes:
        return encode_record(record, what=self.label or self.kind.filename)

    def write(self, directory: Path | str, record: R) -> Path:
        """Validate, then write atomically into ``directory``."""
        return write_record(self.kind, self.kind.path_in(directory), record)


# --- field checks shared by several records -------------------------------------------------------


def require_sha256(value: Any, what: str, field: str) -> str:
    if not is_sha256_hex(value):
        raise InvalidRecord(
            f"{what}: {field} {value!r} is not a lowercase hex SHA-256 (64 characters 0-9a-f)",
            remedy="the record is corrupt; regenerate it",
        )
    return value


def optional_sha256(value: Any, what: str, field: str) -> str | None:
    return None if value is None else require_sha256(value, what, field)


def require_size(value: Any, what: str, field: str) -> int:
    # The schema's "integer" also accepts 1.0; a size must be a real int.
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRecord(
            f"{what}: {field} {value!r} is not a non-negative integer", remedy="the record is corrupt"
        )
    return value


def require_finite(value: Any, what: str, field: str) -> float | int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRecord(f"{what}: {field} {value!r} is not a finite number")
    return value


def check_endpoint(value: Any, what: str, field: str = "destination.endpoint") -> str:
    """Refuse an endpoint that could carry a secret; the message never echoes the value."""
    if not isinstance(value, str):
        raise InvalidRecord(f"{what}: {field} is not a string")
    if any(marker in value for marker in _SECRET_MARKERS) or any(c.isspace() for c in value):
        raise InvalidRecord(
            f"{what}: {field} contains '@', '?', '#' or whitespace (a credential or query string; value not shown)",
            remedy="records hold only the endpoint authority host[:port] and credentials belong in --credentials; "
            "if such a record exists on disk, delete it and rotate the credential",
        )
    return value


def check_destination(obj: Mapping[str, Any], what: str) -> None:
    """``precheck`` for records holding ``destination.endpoint``."""
    destination = obj.get("destination")
    if isinstance(destination, Mapping) and "endpoint" in destination:
        check_endpoint(destination["endpoint"], what)


def check_uri(value: Any, what: str, field: str) -> None:
    """Refuse a URI with userinfo (``user:secret@host``) or a query string; never echo the value."""
    if not isinstance(value, str):
        return
    try:
        parts = urlsplit(value)
    except ValueError:
        raise InvalidRecord(f"{what}: {field} is not a valid URI (value not shown)") from None
    if "@" in parts.netloc or parts.query or any(c.isspace() for c in value):
        raise InvalidRecord(
            f"{what}: {field} carries userinfo, a query string or whitespace (value not shown)",
            remedy="records store only scheme://bucket/prefix URIs; credentials go in --credentials",
        )


def check_source_uri(obj: Mapping[str, Any], what: str) -> None:
    """``precheck`` for records holding ``source_uri`` or ``source.uri``."""
    if "source_uri" in obj:
        check_uri(obj["source_uri"], what, "source_uri")
    source = obj.get("source")
    if isinstance(source, Mapping) and "uri" in source:
        check_uri(source["uri"], what, "source.uri")


def utc_timestamp(moment: datetime | None = None) -> str:
    """ISO-8601 UTC with second precision and a ``Z``, e.g. ``2025-01-31T12:00:00Z``."""
    moment = (moment or datetime.now(timezone.utc)).astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def require_utc_timestamp(value: Any, what: str, field: str) -> str:
    ok = isinstance(value, str) and _UTC_TIMESTAMP.match(value)
    if ok:
        try:  # the calendar check; not fromisoformat, which on Python 3.10 refuses "Z" and 1-5 digit fractions
            datetime(*(int(value[a:b]) for a, b in ((0, 4), (5, 7), (8, 10), (11, 13), (14, 16), (17, 19))))
        except ValueError:
            ok = False
    if not ok:
        raise InvalidRecord(
            f"{what}: {field} {value!r} is not an ISO-8601 UTC time like 2025-01-31T12:00:00Z"
        )
    return value
