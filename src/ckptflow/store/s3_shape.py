"""How the S3 backend cuts its downloads, decided without botocore (so a GCS store can say it before its
S3-interop client exists): by where the endpoint is, unless the caller gave a shape."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from .base import DEFAULT_CONCURRENCY, DownloadShape
from .transfer.stream import DEFAULT_RANGE_SIZE

# How downloads are cut, by where the endpoint is: (connections, range size). Over a network each
# connection's throughput is the limit, so eight connections with 8 MiB ranges. An endpoint on this host
# serves a connection at memory speed from the same cores, so what costs is each request (a signed GET
# here, a lookup there): on loopback SeaweedFS three connections with 24-32 MiB ranges fetched 2 GiB in
# 3.3-3.9 s instead of 4.4-5.0 s, with about 25 % less CPU on each side. A stream holds at most
# 2 x connections + 3 ranges (running, waiting for the in-order hash, queued for it): 216 MiB of
# buffers for the local shape (32 MiB ranges took a fetch's peak RSS over 300 MiB), 152 MiB remote.
REMOTE_DOWNLOADS = DownloadShape(DEFAULT_CONCURRENCY, DEFAULT_RANGE_SIZE)
LOCAL_DOWNLOADS = DownloadShape(3, 24 * 1024 * 1024)


def downloads_for(endpoint_url: str | None) -> DownloadShape:
    """(connections, range size) of downloads from ``endpoint_url``: ``LOCAL_DOWNLOADS`` for an endpoint on
    this host (a loopback address or ``localhost``), else ``REMOTE_DOWNLOADS`` (AWS's default endpoint too)."""
    host = (urlsplit(endpoint_url).hostname or "") if endpoint_url else ""
    if host == "localhost":
        return LOCAL_DOWNLOADS
    try:
        return LOCAL_DOWNLOADS if ipaddress.ip_address(host).is_loopback else REMOTE_DOWNLOADS
    except ValueError:  # a host name
        return REMOTE_DOWNLOADS


def shape_for(endpoint_url: str | None, connections: int | None = None,
                   range_size: int | None = None) -> DownloadShape:
    """The shape given, each part of it that is None taken from ``downloads_for(endpoint_url)``."""
    shape = downloads_for(endpoint_url)
    return DownloadShape(shape.connections if connections is None else connections,
                         shape.range_size if range_size is None else range_size)
