"""Repair: put an archive's part digests record back from the artifact's local copy.

``.posttrain-part-digests.json`` only speeds reads up (``part_digests.py``): every file it covers is
also bound by the whole-file SHA-256 the declaration lists, so reads go on without it (slower, with a
warning naming it). Republishing cannot put it back: the declaration is create-once and already there.
``repair_part_digests`` (``ckptflow repair-part-digests``) does, for every destination the receipt lists
(or those ``destinations`` names):

1. Read-only, at every destination before anything is written: the receipt belongs to this artifact and
   the credentials reach that destination (``destinations.check_binding``); the remote declaration hashes to the
   receipt's ``declaration_sha256``; it lists the record (else there is nothing to repair: ``not-declared``);
   the object at the record's key is read: the declared bytes (``intact``), absent (``missing``) or other
   bytes (``damaged``: truncated, or another artifact's record). For a missing or damaged one, the local
   copy (the publisher wrote it beside the manifest, and prune never removes it) must be exactly the bytes
   the declaration binds (size and SHA-256), else the whole repair is refused by name and nothing is written.
2. Then, at each destination that needs it: a damaged object is deleted (its bytes were read and are not
   the declared ones: nothing the archive binds is lost) and the local copy's bytes are put with a
   create-once write (``sha256`` metadata, and the server checksum where the endpoint takes one, as the
   publisher sends it); an object another writer created meanwhile is accepted only when it holds the
   declared bytes. The object is read back and checked once more.

A dry run does step 1 only and says what step 2 would do. Statuses: ``repaired`` (at least one object put
back), ``intact`` (nothing to do anywhere), ``dry-run``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..digest import sha256_bytes
from ..errors import ConflictError, NotFound, Refused, VerificationFailed
from ..fsutil import require_directory
from ..records import declaration as declaration_record
from ..records import manifest as manifest_record
from ..records import part_digests as part_digests_record
from ..records import receipt as receipt_record
from ..records.inventory import FileEntry
from ..store.base import ObjectStore
from ..store.uri import destination_label
from .destinations import check_binding, select_destinations
from .keys import object_key
from .verify import check_declaration

log = logging.getLogger(__name__)

FILENAME = part_digests_record.FILENAME
STATUSES = ("repaired", "intact", "dry-run")
STATES = ("intact", "missing", "damaged", "not-declared")


@dataclass
class _Judged:
    destination: receipt_record.ReceiptDestination
    store: ObjectStore
    key: str
    state: str  # one of STATES
    detail: str = ""
    entry: FileEntry | None = None  # the declaration's entry of the record
    repaired: bool = False

    def to_dict(self) -> dict:
        return {"destination": self.destination.to_dict(), "key": self.key, "state": self.state,
                "repaired": self.repaired, **({"detail": self.detail} if self.detail else {})}


@dataclass
class RepairResult:
    status: str  # one of STATUSES
    artifact_dir: Path
    local_copy: Path
    destinations: list[_Judged] = field(default_factory=list)

    def to_report(self) -> dict:
        """The ``repair-part-digests`` report (schemas/report_repair_part_digests.schema.json)."""
        return {"status": self.status, "dry_run": self.status == "dry-run", "artifact_dir": str(self.artifact_dir),
                "record": FILENAME, "local_copy": str(self.local_copy),
                "destinations": [d.to_dict() for d in self.destinations]}


def repair_part_digests(artifact_dir: Path | str, store_for, *, destinations: list[str] | tuple[str, ...] | None = None,
                        dry_run: bool = False) -> RepairResult:
    """Put the part digests record back at every destination (or those ``destinations`` names) where it is
    missing or damaged, from ``artifact_dir``'s local copy; see the module docstring. ``store_for`` as for
    restore (``store.open.store_factory``)."""
    artifact_dir = Path(os.path.abspath(require_directory(
        artifact_dir, "artifact directory", "pass the published checkpoint_artifacts/iter_N directory")))
    manifest_record.read_manifest(artifact_dir)
    receipt_path = receipt_record.path_in(artifact_dir)
    if not os.path.lexists(receipt_path):
        raise NotFound(f"{receipt_path} does not exist: nothing records where {artifact_dir} was archived",
                       remedy="publish the artifact first (`ckptflow publish`)", path=str(receipt_path))
    receipt = receipt_record.read_receipt(artifact_dir)
    local = part_digests_record.path_in(artifact_dir)
    judged = [_judge(artifact_dir, receipt.at(d), receipt_path, store_for)
              for d in select_destinations(receipt, destinations, str(receipt_path))]
    todo = [j for j in judged if j.state in ("missing", "damaged")]
    data = _local_copy(local, todo) if todo else None
    result = RepairResult("intact", artifact_dir, local, judged)
    if not todo:
        return result
    if dry_run:
        result.status = "dry-run"
        return result
    for j in todo:
        _put_back(j, data)
    result.status = "repaired"
    return result


def _judge(artifact_dir: Path, receipt: receipt_record.Receipt, receipt_path: Path, store_for) -> _Judged:
    """Read-only: the state of the record at the one destination ``receipt`` names (``Receipt.at``)."""
    dest = receipt.destination
    store = store_for(dest)
    check_binding(store, receipt, artifact_dir)
    state = check_declaration(store, dest.prefix, receipt.declaration_sha256)
    if state.state != "ok":
        raise VerificationFailed(
            f"the declaration at {destination_label(dest, state.key)} is not the one {receipt_path} binds "
            f"({state.state}{': ' + state.detail if state.detail else ''}); a part digests record cannot repair "
            "that, nothing was written", path=str(receipt_path),
            remedy="restore the archive from a backup, or publish the artifact to a new destination")
    declaration = declaration_record.parse_declaration(
        store.get_bytes(state.key), what=str(destination_label(dest, state.key)))
    key = object_key(dest.prefix, FILENAME)
    entry = next((e for e in declaration.files if e.path == FILENAME), None)
    if entry is None:
        return _Judged(dest, store, key, "not-declared", "the declaration lists no part digests record")
    try:
        found = store.get_bytes(key)
    except NotFound:
        return _Judged(dest, store, key, "missing", "absent from the store", entry)
    got = sha256_bytes(found)
    if (len(found), got) == (entry.size, entry.sha256):
        return _Judged(dest, store, key, "intact", entry=entry)
    return _Judged(dest, store, key, "damaged", f"{len(found)} bytes sha256 {got}, declared {entry.size} bytes "
                   f"sha256 {entry.sha256}", entry)


def _local_copy(local: Path, todo: list[_Judged]) -> bytes:
    """The local record's bytes, when they are the ones every destination's declaration binds; else refused."""
    try:
        data = local.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"{local} does not exist: there is no local copy of the record to put back at "
                       f"{destination_label(todo[0].destination, todo[0].key)}; nothing was written",
                       path=str(local), remedy="reads check each file by its declared whole-file SHA-256 without "
                       "the record; to have it again, bring back a copy of it (or of the artifact with it)") from None
    got = FileEntry(FILENAME, len(data), sha256_bytes(data))
    for j in todo:
        if (got.size, got.sha256) != (j.entry.size, j.entry.sha256):
            raise Refused(f"{local} ({got.size} bytes, sha256 {got.sha256}) is not the record the declaration at "
                          f"{destination_label(j.destination, j.destination.prefix)} binds ({j.entry.size} bytes, "
                          f"sha256 {j.entry.sha256}); nothing was written", path=str(local),
                          remedy="put the record back from a copy that matches the declaration; reads check each "
                          "file by its declared whole-file SHA-256 meanwhile")
    return data


def _put_back(j: _Judged, data: bytes) -> None:
    """Replace the missing or damaged object at ``j.key`` with the declared bytes ``data``, then read it back."""
    where = destination_label(j.destination, j.key)
    if j.state == "damaged":
        # Its bytes were read by _judge and are not the declared ones (size or SHA-256 differs): the archive
        # binds nothing in them, and the declared bytes are in hand.
        j.store.delete(j.key)
    if not j.store.put_bytes_create_once(j.key, data, sha256=j.entry.sha256):
        log.info("%s was created by another writer meanwhile; checking its bytes", where)
    try:
        back = j.store.get_bytes(j.key)
    except NotFound:
        back = None
    if back != data:
        raise ConflictError(f"{where} does not hold the declared record after the repair (another writer changed it)",
                            path=j.key, remedy="stop the other writer, then rerun `ckptflow repair-part-digests`")
    j.repaired = True
    log.info("put %s back at %s", FILENAME, where)
