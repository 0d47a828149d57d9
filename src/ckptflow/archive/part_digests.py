"""The part digests an archive's declaration binds, read from the store for a verified read.

``load_part_digests`` finds the part digests record among the declared files, GETs it, holds its bytes
to the size and SHA-256 the declaration lists for it, parses it and checks that it describes every file
it covers as the declaration does (``PartDigestRecord.check_bound``). Fetch, restore and every read
back (verify --read-data, a scrub, prune's read-back) then check each range's parts as they arrive
instead of hashing each file whole; an archive whose declaration lists no such record (published before
part digests existed, or by another writer) is read and hashed whole as always.

The record only speeds a read up: every file it covers is also bound by the whole-file SHA-256 the
declaration lists. So a read that only needs the bytes (fetch, restore) takes ``usable_part_digests``: a
record that is missing from the store, or whose bytes are not the declared ones (truncated, replaced by
another artifact's), costs one warning naming it and the files are hashed whole, slower but as strictly.
A record whose bytes are the declared ones but that contradicts the declaration is refused all the same
(the declaration itself is then inconsistent). ``ckptflow repair-part-digests`` puts the record back
from the artifact's local copy (``repair.py``); verify keeps reporting a record that is not there as damage.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ..digest import PartDigests, sha256_bytes
from ..errors import NotFound, VerificationFailed
from ..records import part_digests as part_digests_record
from ..records.inventory import FileEntry
from ..store.base import ObjectStore
from .keys import object_key

FILENAME = part_digests_record.FILENAME

log = logging.getLogger(__name__)


REPAIR_REMEDY = ("put the record back from the artifact's local copy with `ckptflow repair-part-digests "
                 "--artifact-dir DIR` (reads check each file by its whole-file SHA-256 until then)")


def load_part_digests(store: ObjectStore, prefix: str, declared: Iterable[FileEntry]) -> dict[str, PartDigests]:
    """Path -> part digests of the files the declaration ``declared`` (every file it lists) binds them for;
    empty when it lists no part digests record. A record that is missing, is not the declared bytes or
    disagrees with the declaration is refused, naming it (``NotFound``, ``VerificationFailed``,
    ``InvalidRecord``)."""
    declared = tuple(declared)
    entry = next((e for e in declared if e.path == FILENAME), None)
    if entry is None:
        return {}
    key = object_key(prefix, FILENAME)
    where = str(store.destination.uri(key))
    try:
        data = store.get_bytes(key)
    except NotFound:
        raise NotFound(f"{where} is declared by the archive but missing from the store",
                       remedy=REPAIR_REMEDY) from None
    got = sha256_bytes(data)
    if len(data) != entry.size or got != entry.sha256:
        raise VerificationFailed(
            f"{where} ({len(data)} bytes, sha256 {got}) is not the part digests record the declaration binds "
            f"({entry.size} bytes, sha256 {entry.sha256})",
            remedy=REPAIR_REMEDY)
    record = part_digests_record.parse_part_digests(data, what=where)
    record.check_bound(declared, where)
    return record.by_path()


def usable_part_digests(store: ObjectStore, prefix: str, declared: Iterable[FileEntry]) -> dict[str, PartDigests]:
    """``load_part_digests``, or none when the record is missing from the store or is not the declared bytes:
    then one warning names the record, and every file is checked by the whole-file SHA-256 the declaration
    binds (slower, as strict). A declared record that contradicts the declaration is still refused."""
    try:
        return load_part_digests(store, prefix, declared)
    except (NotFound, VerificationFailed) as exc:
        log.warning("%s; checking every file by its declared whole-file SHA-256 instead (slower)", exc)
        return {}
