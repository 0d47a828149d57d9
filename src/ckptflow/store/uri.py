"""Store URIs: ``s3://bucket/key``, ``gs://bucket/key`` and ``file:///absolute/directory``.

``s3://`` and ``gs://``: the bucket is the authority, the key is everything after the first ``/`` taken
literally (no percent-decoding, as the AWS and gcloud CLIs do), one trailing ``/`` dropped. An empty
key means the bucket root.

``file://`` (an archive on a shared file system) names a *directory*: ``file:///lustre/archive/run1``
parses to ``bucket="/lustre/archive/run1"`` (the absolute root of a ``LocalStore``) and ``key=""``.
A path alone cannot say where an archive root ends and a key begins, so no split is attempted: any
directory inside an archive is itself a valid root, because ``LocalStore`` keeps each object's metadata
beside the object (``<dir>/.ckptflow-meta/``), not at the root. Opening ``file:///archive/p/iter_5``
therefore reads the objects a publisher wrote through root ``/archive`` with keys ``p/iter_5/...``,
with the same sha256 metadata. ``file://localhost/path`` is accepted; other hosts are refused. The path
is taken literally (no percent-decoding), must be absolute, and may not contain ``.``/``..``/empty segments.

Every refusal names the URI and says what is wrong; a URI with user information (``s3://user:pw@b``) is
refused without being echoed, because that part may be a secret.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRecord
from ..fsutil import safe_relpath

SCHEMES = ("s3", "gs", "file")
_BUCKET_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,220}[A-Za-z0-9]$")


@dataclass(frozen=True, slots=True)
class StoreURI:
    scheme: str  # "s3", "gs" or "file"
    bucket: str  # bucket name, or for file: the absolute root directory
    key: str  # "" or a validated relative key (prefix) without a trailing slash

    def child(self, relpath: str) -> StoreURI:
        """The URI of ``relpath`` (validated) below this one."""
        rel = safe_relpath(relpath, what=f"key below {self}").as_posix()
        return StoreURI(self.scheme, self.bucket, f"{self.key}/{rel}" if self.key else rel)

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.bucket}" + (f"/{self.key}" if self.key else "")
        return f"{self.scheme}://{self.bucket}" + (f"/{self.key}" if self.key else "")


def destination_uri(dest: Any, key: str = "") -> StoreURI:
    """The URI of ``key`` at a destination: a store's ``Destination`` or a receipt's (anything with scheme,
    endpoint and bucket); for ``file`` the endpoint is the archive root. Every ``scheme://bucket/key`` a
    message or a record names is built here."""
    if dest.scheme == "file":
        return StoreURI("file", dest.endpoint.rstrip("/") or "/", key.strip("/"))
    return StoreURI(dest.scheme, dest.bucket, key.strip("/"))


def destination_label(dest: Any, key: str = "") -> str:
    """How a message names ``key`` at a destination: its URI, and the endpoint it lives at unless ``file``."""
    uri = destination_uri(dest, key)
    return str(uri) if dest.scheme == "file" else f"{uri} at {dest.endpoint}"


def _refuse(uri: str, what: str, problem: str, remedy: str) -> InvalidRecord:
    return InvalidRecord(f"{what} {uri!r} {problem}", remedy=remedy)


def parse_store_uri(uri: str, *, what: str = "store URI", schemes: tuple[str, ...] = SCHEMES) -> StoreURI:
    """Parse and validate ``uri``; refuse unknown schemes, empty buckets and unsafe keys by name."""
    if not isinstance(uri, str) or "://" not in uri:
        raise InvalidRecord(
            f"{what} {uri!r} is not a URI", remedy=f"use one of {', '.join(s + '://' for s in schemes)}"
        )
    scheme, rest = uri.split("://", 1)
    if scheme not in schemes:
        raise _refuse(uri, what, f"has the unsupported scheme {scheme!r}",
                      f"use one of {', '.join(s + '://' for s in schemes)}")
    if "\x00" in rest:
        raise _refuse(uri, what, "contains a NUL byte", "the URI is corrupt")
    if scheme == "file":
        return _parse_file(uri, rest, what)
    authority, _, key = rest.partition("/")
    if "@" in authority:
        raise InvalidRecord(
            f"{what} has user information before the bucket name",
            remedy="keys belong in the credentials file, never in a URI",
        )
    if not authority:
        raise _refuse(uri, what, "has an empty bucket name", f"write {scheme}://BUCKET/PREFIX")
    if not _BUCKET_RE.match(authority):
        raise _refuse(uri, what, f"has an invalid bucket name {authority!r}",
                      "bucket names are 3-222 letters, digits, '.', '_' or '-'")
    if key.endswith("/"):
        key = key[:-1]
    if key:
        key = safe_relpath(key, what=f"key of {what} {uri!r}").as_posix()
    return StoreURI(scheme, authority, key)


def _parse_file(uri: str, rest: str, what: str) -> StoreURI:
    if rest.startswith("localhost/"):
        rest = rest[len("localhost"):]
    if not rest.startswith("/"):
        raise _refuse(uri, what, "does not name an absolute path on this machine",
                      "write file:///absolute/path (three slashes)")
    path = rest.rstrip("/")
    if not path:
        raise _refuse(uri, what, "names the file-system root", "name the archive directory")
    safe_relpath(path[1:], what=f"path of {what} {uri!r}")
    return StoreURI("file", path, "")


def validate_key(key: str, *, what: str = "object key") -> str:
    """An object key is a safe relative POSIX path (no empty, ``.`` or ``..`` segment); return it."""
    return safe_relpath(key, what=what).as_posix()


def segment_prefix(prefix: str, *, what: str = "prefix") -> str:
    """A prefix as whole path segments: ``""`` or a safe key normalised to end in ``/``, so that ``a/run1``
    never matches ``a/run10/...`` or ``a/run1-backup``."""
    key = prefix.strip("/")
    if not key:
        return ""
    return safe_relpath(key, what=what).as_posix() + "/"


def validate_prefix(prefix: str, *, what: str = "listing prefix") -> str:
    """A listing prefix is ``""`` or a safe key, optionally ending in ``/``; return it unchanged."""
    if prefix:
        safe_relpath(prefix[:-1] if prefix.endswith("/") else prefix, what=what)
    return prefix
