"""The one error hierarchy of ckptflow.

Every error names the object it is about and what to do about it. Subclasses also inherit the matching
builtin so callers that only know the standard library can still catch them (``FileNotFoundError``,
``FileExistsError``, ``ValueError``, ``PermissionError``, ``OSError``).

The CLI maps each class to one line on stderr and an exit code; a traceback is shown only when
``CKPTFLOW_DEBUG=1``.
"""

from __future__ import annotations

import errno


class CkptflowError(Exception):
    """Base class. ``remedy`` is the action that fixes the problem, appended to the message."""

    def __init__(self, message: str, *, remedy: str | None = None, path: str | None = None):
        self.message = message
        self.remedy = remedy
        self.path = path
        super().__init__(self.__str__())

    def add_context(self, *, before: str = "", after: str = "", remedy: str | None = None) -> None:
        """Add what a caller knows to the message of an error it is about to re-raise (``before`` + message +
        ``after``; ``remedy`` replaces the remedy when given); ``str(exc)`` and ``exc.args`` follow."""
        self.message = f"{before}{self.message}{after}"
        if remedy is not None:
            self.remedy = remedy
        self.args = (str(self),)

    def __str__(self) -> str:
        if self.remedy:
            return f"{self.message}; {self.remedy}"
        return self.message


class Refused(CkptflowError, PermissionError):
    """The request is well-formed but would break an invariant; nothing was changed."""


class InvalidRecord(CkptflowError, ValueError):
    """A record, declaration, sidecar or header failed validation (encoding, schema, paths, protocol)."""


class UnsafePath(InvalidRecord):
    """A path escapes its directory, is absolute, has a backslash/NUL, or is a symlink."""


class VerificationFailed(CkptflowError, ValueError):
    """Bytes on disk or in the store do not match the recorded size or digest."""


class ConflictError(CkptflowError, FileExistsError):
    """An existing object or record differs from what this request would write."""


class NotFound(CkptflowError, FileNotFoundError):
    """A required file, record or object is absent."""


class StoreError(CkptflowError, OSError):
    """The object store failed or answered unexpectedly (after retries)."""


class EndpointUnreachable(StoreError):
    """No connection to the endpoint could be made (after retries): the server is down or ``endpoint_url`` wrong."""


class OutOfSpace(CkptflowError, OSError):
    """A file system has no room for what a step writes (``errno`` is ENOSPC): it filled while writing.

    ``path`` is the file (or directory) written, ``needed`` and ``free`` the bytes still to write and the
    bytes free when this was raised (None when unknown); the remedy says how much to free and where.
    """

    def __init__(self, message: str, *, remedy: str | None = None, path: str | None = None,
                 needed: int | None = None, free: int | None = None):
        super().__init__(message, remedy=remedy, path=path)
        self.errno, self.needed, self.free = errno.ENOSPC, needed, free


class InsufficientSpace(OutOfSpace, Refused):
    """Refused before the first byte: the free space is less than what the step would write; nothing changed."""


class EndpointNotQualified(Refused):
    """The endpoint has no passing probe record, or its probe showed create-once is not enforced."""


class PreflightFailed(Refused):
    """The upload destination checked before training (prefix, credentials, bucket, create-once) cannot take
    the run's artifacts; training does not start."""


class UsageError(CkptflowError, ValueError):
    """Command-line arguments are inconsistent; the CLI exits with status 2."""


class MissingExtra(UsageError):
    """A verb needs an optional dependency group (``ckptflow[convert]``) that is not installed; exit 2."""
