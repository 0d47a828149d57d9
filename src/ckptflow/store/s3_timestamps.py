"""The timestamps of S3 responses, parsed without dateutil: ``parse_timestamp``, the parser of our clients.

botocore parses every timestamp it is sent (each listed object's ``LastModified``, each GET's and HEAD's
``Last-Modified`` header) with dateutil's general parser, which costs more CPU than the rest of parsing
a listed object. S3 sends two fixed forms: ISO 8601 in UTC (``2026-12-01T15:56:21.000Z``) in XML bodies
and the HTTP date (``Tue, 01 Dec 2026 15:56:21 GMT``) in headers; both are read here by the standard
library, to the same aware UTC ``datetime``. Anything else (epoch seconds, other zones, a form an older
Python does not read) goes to botocore's own parser, so no value is read differently than before.
"""

from __future__ import annotations

from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from botocore.utils import parse_timestamp as _botocore_parse_timestamp


def parse_timestamp(value: Any) -> datetime:
    """``value`` from a response as an aware ``datetime``, as botocore's default parser would give it."""
    if isinstance(value, str):
        try:
            if value.endswith("Z") and "T" in value:
                return datetime.fromisoformat(value[:-1]).replace(tzinfo=timezone.utc)
            if value.endswith(" GMT"):
                when = parsedate_to_datetime(value)
                if when.tzinfo is not None and when.utcoffset() is not None and not when.utcoffset():
                    return when.astimezone(timezone.utc)
        except (ValueError, TypeError, IndexError):
            pass
    return _botocore_parse_timestamp(value)


def install(session: Any) -> None:
    """Make ``parse_timestamp`` the timestamp parser of every client ``session`` (botocore) creates."""
    session.get_component("response_parser_factory").set_parser_defaults(timestamp_parser=parse_timestamp)
