"""Object-store credentials: the JSON file format, its strict reader, and what may be shown of it.

The file (``--credentials`` or ``$CKPTFLOW_CREDENTIALS``) holds exactly one JSON object::

    {"aws_access_key_id": "...", "aws_secret_access_key": "...",
     "endpoint_url": "https://host:port" | null, "region_name": "us-east-1" | null}

``endpoint_url`` and ``region_name`` may be omitted (null). Both keys are secrets as far as ckptflow is
concerned: they never appear in a repr, a record, a report, a log line or an exception message. What
records may store is ``endpoint_authority`` (host[:port]). For the same reason an ``endpoint_url`` that
carries userinfo (``https://user:pass@host``), a query or a fragment is refused.

Where credentials come from, first match wins: the ``--credentials`` file, else the file
``$CKPTFLOW_CREDENTIALS`` names, else (``s3://`` only) botocore's standard chain. ``CredentialsSource`` says
which one a store used (a path or botocore's method name, never a key) for the reports; ``SOURCES_IN_ORDER``
names them in that order, for the error that none of them had keys.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import InvalidRecord, NotFound
from ..jsonio import read_json_object

ENV_VAR = "CKPTFLOW_CREDENTIALS"
FROM_FILE, FROM_ENV, FROM_CHAIN = "file", f"env:{ENV_VAR}", "aws-chain"
SOURCES_IN_ORDER = (
    "--credentials FILE",
    f"${ENV_VAR}",
    "botocore's standard chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE with ~/.aws/credentials "
    "and ~/.aws/config, container and instance roles; s3:// only)",
)
_REQUIRED = ("aws_access_key_id", "aws_secret_access_key")
_OPTIONAL = ("endpoint_url", "region_name")
_REMEDY = (
    'the file must hold {"aws_access_key_id": str, "aws_secret_access_key": str, '
    '"endpoint_url": str|null, "region_name": str|null} and nothing else'
)


@dataclass(frozen=True, slots=True)
class CredentialsSource:
    """Where a store's credentials came from: ``file`` or ``env:CKPTFLOW_CREDENTIALS`` with the file's
    path, or ``aws-chain`` with botocore's method (``env``, ``shared-credentials-file``, ``iam-role`` …;
    None when the chain found nothing). Safe to show: it holds no key."""

    source: str
    path: str | None = None
    method: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        if self.source == FROM_CHAIN:
            return {"source": self.source, "method": self.method}
        return {"source": self.source, "path": self.path}


@dataclass(frozen=True, slots=True)
class Credentials:
    aws_access_key_id: str
    aws_secret_access_key: str
    endpoint_url: str | None = None
    region_name: str | None = None
    origin: CredentialsSource | None = field(default=None, compare=False)  # where they were read from

    def __post_init__(self) -> None:
        for name in _REQUIRED:
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise InvalidRecord(f"credentials field {name!r} must be a non-empty string", remedy=_REMEDY)
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidRecord(f"credentials field {name!r} must be a non-empty string or null", remedy=_REMEDY)
        if self.endpoint_url is not None:
            _check_endpoint_url(self.endpoint_url)

    def __repr__(self) -> str:
        return (
            "Credentials(aws_access_key_id=<redacted>, aws_secret_access_key=<redacted>, "
            f"endpoint_url={self.endpoint_url!r}, region_name={self.region_name!r})"
        )

    __str__ = __repr__


def _check_endpoint_url(url: str) -> None:
    """Refuse URLs that are not plain http(s)://host[:port][/path]; never echo the URL (it may hold a secret)."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError on a malformed port
    except ValueError:
        raise InvalidRecord("credentials field 'endpoint_url' is not a valid URL", remedy=_REMEDY) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRecord(
            "credentials field 'endpoint_url' must be http://host[:port] or https://host[:port]", remedy=_REMEDY
        )
    if "@" in parts.netloc:
        raise InvalidRecord(
            "credentials field 'endpoint_url' carries user information",
            remedy="put the keys in aws_access_key_id/aws_secret_access_key, never in the URL",
        )
    if parts.query or parts.fragment:
        raise InvalidRecord("credentials field 'endpoint_url' has a query or fragment", remedy="remove it")


def load_credentials(path: Path | str, origin: CredentialsSource | None = None) -> Credentials:
    """Read and validate a credentials file; errors name the file and the field, never a value.
    ``origin`` says how the file was named (default: a ``file`` source with this path)."""
    path = Path(path).expanduser()
    what = f"credentials file {path}"
    try:
        obj = read_json_object(path, what=what)
    except NotFound:
        raise NotFound(
            f"{what} does not exist", remedy=f"pass --credentials FILE or set {ENV_VAR}", path=str(path)
        ) from None
    except InvalidRecord as exc:
        # The JSON decoder's message quotes positions, not content; keep only that much.
        raise InvalidRecord(exc.message, remedy=_REMEDY, path=str(path)) from None
    missing = [k for k in _REQUIRED if k not in obj]
    extra = sorted(k for k in obj if k not in _REQUIRED + _OPTIONAL)
    if missing or extra:
        found = []
        if missing:
            found.append(f"missing {', '.join(missing)}")
        if extra:
            found.append(f"unexpected field(s) {', '.join(repr(k[:40]) for k in extra)}")
        raise InvalidRecord(f"{what}: {'; '.join(found)}", remedy=_REMEDY, path=str(path))
    for name in _REQUIRED + _OPTIONAL:
        value = obj.get(name)
        if value is None and name in _OPTIONAL:
            continue
        if not isinstance(value, str) or not value:
            kind = "empty string" if value == "" else type(value).__name__
            raise InvalidRecord(
                f"{what}: field {name!r} must be a non-empty string, found {kind}", remedy=_REMEDY, path=str(path)
            )
    try:
        return Credentials(**{k: obj.get(k) for k in _REQUIRED + _OPTIONAL},
                           origin=origin or CredentialsSource(FROM_FILE, os.path.abspath(path)))
    except InvalidRecord as exc:
        raise InvalidRecord(f"{what}: {exc.message}", remedy=exc.remedy, path=str(path)) from None


def endpoint_authority(creds: Credentials | None) -> str:
    """``host[:port]`` of the endpoint, lower-cased, without userinfo/path/query: safe to record.

    Without an ``endpoint_url`` this is AWS's: ``s3.<region>.amazonaws.com`` or ``s3.amazonaws.com``.
    """
    if creds is None or creds.endpoint_url is None:
        region = creds.region_name if creds is not None else None
        return f"s3.{region}.amazonaws.com" if region else "s3.amazonaws.com"
    parts = urlsplit(creds.endpoint_url)
    host = parts.hostname or ""
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    return f"{host}:{parts.port}" if parts.port is not None else host


def resolve_credentials_source(arg: str | os.PathLike[str] | None) -> CredentialsSource | None:
    """The credentials file to use and how it was named: ``arg`` if given (``file``), else
    ``$CKPTFLOW_CREDENTIALS`` (``env:CKPTFLOW_CREDENTIALS``), else None (the store's default, if any)."""
    if arg is not None and str(arg) != "":
        return CredentialsSource(FROM_FILE, os.path.abspath(Path(arg).expanduser()))
    env = os.environ.get(ENV_VAR, "")
    return CredentialsSource(FROM_ENV, os.path.abspath(Path(env).expanduser())) if env else None


def resolve_credentials_path(arg: str | os.PathLike[str] | None) -> Path | None:
    """The credentials file to use: ``arg`` if given, else ``$CKPTFLOW_CREDENTIALS``, else None."""
    source = resolve_credentials_source(arg)
    return Path(source.path) if source is not None and source.path else None
