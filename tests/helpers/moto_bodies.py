"""moto's request builder takes only ``bytes`` bodies; ckptflow sends multipart parts as reused ``bytearray``s.

Real servers (SeaweedFS, S3, GCS) receive a ``bytearray`` like any other body: http.client hands it to
``socket.sendall``. moto's in-process stub passes the body to werkzeug's ``EnvironBuilder``, which
treats anything but ``bytes``/``str`` as form fields. ``mock_aws_bytes_bodies()`` is ``moto.mock_aws()``
plus a botocore handler that gives moto a ``bytes`` copy, registered only while the mock is active so the
SeaweedFS tests keep exercising the real body type.
"""

from __future__ import annotations

import contextlib

import botocore.handlers
from moto import mock_aws

_EVENT = "before-send.s3"


def _bytes_body(request, **_):
    if isinstance(request.body, bytearray):
        request.body = bytes(request.body)


@contextlib.contextmanager
def mock_aws_bytes_bodies():
    entry = (_EVENT, _bytes_body)
    # More specific event names run first, so this precedes moto's own "before-send" stub.
    botocore.handlers.BUILTIN_HANDLERS.append(entry)
    try:
        with mock_aws():
            yield
    finally:
        botocore.handlers.BUILTIN_HANDLERS.remove(entry)
