"""The copies of an archived artifact that its receipt lists, tried in the receipt's order until one serves.

A receipt may list several destinations (``publish --add-destination``), the current one first. Every reader
that starts from a receipt goes through ``first_serving``: ``fetch_from_receipt`` (the workflow's ``fetch``
of a pruned artifact, and materialize's fetch of one) and materialize's source of a pruned artifact
(``materialize.source``), and restore (``restore.restore_artifact``). A destination that cannot serve (unreachable, its ``file://`` root gone,
credentials that are missing or reach another endpoint, its declaration or an object missing or damaged)
raises ``Unusable``: it is skipped with one warning naming it and why, and the next one is tried; any other
error (a local refusal: a foreign stage, too little space, a busy lock) stops at once. When none serves,
the error names each destination and why (with one destination, its own error, as it was).

Every copy is bound by the receipt's declaration digest: a destination whose declaration is another one
cannot serve. A fetch stage is bound by that digest too (``fetch._own_copy``), so the files one
destination verified and put in place stay, and the next one completes the stage.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..errors import CkptflowError, InvalidRecord, NotFound, Refused, StoreError, VerificationFailed
from ..lock import DEFAULT_WAIT_SECONDS
from ..records import receipt as receipt_record
from ..store import Credentials
from ..store.open import credentials_for, open_destination
from ..store.uri import destination_label, destination_uri

log = logging.getLogger(__name__)

T = TypeVar("T")

# What a read of an archive raises when the copy it reads cannot serve: an object missing, not the
# declared bytes or not a valid record, or the store failing. A local refusal is none of these.
SOURCE_ERRORS = (NotFound, VerificationFailed, InvalidRecord, StoreError)


class Unusable(Exception):
    """The destination being tried cannot serve: ``error`` says why (the next one is tried)."""

    def __init__(self, error: CkptflowError | OSError):
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class Skipped:
    """A destination tried before the one that served, and why it could not."""

    destination: receipt_record.ReceiptDestination
    error: CkptflowError | OSError

    @property
    def label(self) -> str:
        return destination_label(self.destination, self.destination.prefix)

    def to_dict(self) -> dict[str, str]:
        return {"source_uri": str(destination_uri(self.destination, self.destination.prefix)), "detail": str(self.error)}


def first_serving(destinations: Sequence[receipt_record.ReceiptDestination],
                  attempt: Callable[[receipt_record.ReceiptDestination], T], *, lister: str,
                  serves: str, after: str = "", remedy: str = "make one of those copies reachable and whole, then rerun",
                  path: str | None = None) -> tuple[T, receipt_record.ReceiptDestination, list[Skipped]]:
    """``attempt(destination)`` for each of ``destinations`` in order until one returns; one that raises
    ``Unusable`` is skipped with a warning naming it and why. ``lister`` names the receipt in messages,
    ``serves`` what is served ("the fetch of ..."). Returns the result, the destination that served and
    those skipped; when none serves, raises the one error (a single destination) or one naming each
    (``after`` appended to its message, with ``remedy`` and ``path``)."""
    skipped: list[Skipped] = []
    for n, dest in enumerate(destinations, 1):
        try:
            return attempt(dest), dest, skipped
        except Unusable as exc:
            skipped.append(Skipped(dest, exc.error))
            if n < len(destinations):
                log.warning("%s cannot serve %s (%s); trying the next destination %s lists",
                            skipped[-1].label, serves, exc.error, lister)
    if len(skipped) == 1:
        raise skipped[0].error
    why = "; ".join(f"at {s.label}: {s.error}" for s in skipped)
    first = skipped[0].error
    cls = type(first) if isinstance(first, (NotFound, VerificationFailed, Refused, StoreError)) else StoreError
    raise cls(f"none of the {len(skipped)} destinations {lister} lists could serve {serves} ({why}){after}",
              remedy=remedy, path=path)


def open_copy(dest: receipt_record.ReceiptDestination, credentials: Credentials | Any, what: str):
    """The store of one receipt destination, opened with ``credentials`` (a ``Credentials``, or the raw
    ``--credentials`` value loaded for this destination's scheme); ``Unusable`` when it cannot be."""
    uri = destination_uri(dest, dest.prefix)
    try:
        creds = credentials if isinstance(credentials, Credentials) else credentials_for(uri, credentials)
        return open_destination(dest, creds, what=what), uri
    except (CkptflowError, OSError) as exc:
        raise Unusable(exc) from exc


def fetch_from_receipt(artifact_dir: Path | str, dst: Path | str, credentials: Credentials | Any = None, *,
                       destinations: Iterable[receipt_record.ReceiptDestination] | None = None,
                       progress: bool | None = None, reserve: int = 0, reserve_for: str = "",
                       lock_wait_seconds: float = DEFAULT_WAIT_SECONDS, components: Iterable[str] | None = None):
    """``fetch.fetch_artifact`` of the archive ``artifact_dir``'s receipt names into ``dst/iter_N``, from the
    first of its destinations that serves (``destinations``: those to try, in order; default every one).
    Returns the ``FetchResult``, the destination that served and the ``Skipped`` ones before it."""
    from .fetch import fetch_artifact

    artifact_dir = Path(artifact_dir)
    receipt = receipt_record.read_receipt(artifact_dir)
    receipt_path = receipt_record.path_in(artifact_dir)
    chosen = list(destinations) if destinations is not None else list(receipt.destinations)

    def attempt(dest: receipt_record.ReceiptDestination):
        store, uri = open_copy(dest, credentials, str(receipt_path))
        try:
            return fetch_artifact(str(uri), dst, store=store, progress=progress, reserve=reserve, reserve_for=reserve_for,
                                  lock_wait_seconds=lock_wait_seconds, components=components,
                                  declaration_sha256=receipt.declaration_sha256, declared_by=str(receipt_path))
        except SOURCE_ERRORS as exc:  # what it verified and put in place stays; the next destination has the rest
            raise Unusable(exc) from exc

    return first_serving(chosen, attempt, lister=str(receipt_path), serves=f"the fetch of {artifact_dir.name}")
