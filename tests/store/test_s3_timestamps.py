"""The S3 clients' timestamp parser reads every form botocore's own parser reads, to the same instant."""

from __future__ import annotations

import pytest
from botocore.utils import parse_timestamp as botocore_parse_timestamp

from ckptflow.store.s3_timestamps import parse_timestamp

FORMS = [
    "2026-12-01T15:56:21.000Z", "2026-12-01T15:56:21Z", "2026-12-01T15:56:21.123456Z", "2026-12-01T15:56:21.12Z",
    "Tue, 01 Dec 2026 15:56:21 GMT", "Tue, 01 Dec 2026 15:56:21 +0200", "2026-12-01T15:56:21+02:00",
    "1700000000", 1700000000, 1700000000.5,
]


@pytest.mark.parametrize("value", FORMS)
def test_parse_timestamp_gives_the_instant_botocore_gives(value):
    got, want = parse_timestamp(value), botocore_parse_timestamp(value)
    assert got == want and got.utcoffset() == want.utcoffset()


@pytest.mark.parametrize("value", ["Wed, 31 Feb 2026 15:56:21 GMT", "2026-13-01T00:00:00Z", "not a time"])
def test_parse_timestamp_refuses_what_botocore_refuses(value):
    with pytest.raises(ValueError):
        botocore_parse_timestamp(value)
    with pytest.raises(ValueError):
        parse_timestamp(value)
