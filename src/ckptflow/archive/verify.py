"""Receipt-bound remote verification, the one check that verify, prune-verified and publish
--delete-local share before they trust (or delete) anything.

``check_remote_inventory`` HEADs objects against an inventory: the publisher runs it before it writes
a receipt (and records the server checksums it saw). ``check_receipt`` is the proof a receipt gives:
the remote declaration hashes to the receipt's digest, and every recorded object still has its size,
its ``sha256`` metadata and, where the receipt recorded one, the *same server checksum* (S3
``ChecksumSHA256``, asked for with ``ChecksumMode=ENABLED``). User metadata alone never proves an
object: anyone can write it beside other bytes. An object whose receipt records no server checksum
(the endpoint computes none, or an older receipt) is ``unverifiable`` unless its bytes are read and
hashed; on ``file://`` the bytes are local, so they are always read.

Reading back (``--read-data``) streams every object to be read through fetch's concurrent ranged GETs
and hashes the ranges in order as they arrive (``transfer.hash_batch``): nothing is written to disk
and memory stays within the range window. Where the declaration binds part digests
(``part_digests.load_part_digests``), each range's parts are checked by the worker that read it
instead, on every core; a part digests record that cannot be read or is not the declared one is
reported in its own row (``missing`` or ``mismatch``) and the objects are then hashed whole. ``Subset`` picks a stable slice of the objects for a
scrub spread over scheduled runs.

Each object ends in one state: ``ok``, ``missing``, ``changed`` (size, digest or server checksum
differs, or the recorded server checksum is gone: the object was replaced), ``mismatch`` (its bytes,
read back, are not the declared ones), or ``unverifiable``. An object without ``sha256`` metadata is
``unverifiable`` by HEAD alone; when bytes are read it is read and held to the declared digest like any other.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from ..digest import FileDigest, PartDigests, sha256_bytes
from ..errors import CkptflowError, NotFound, UsageError, VerificationFailed
from ..fsutil import require_directory
from ..progress import ByteProgress
from ..records import declaration as declaration_record
from ..records import receipt as receipt_record
from ..records import utc_timestamp
from ..records import verification as verification_record
from ..records.inventory import FileEntry
from ..store.base import ObjectStore
from ..store.transfer import HashedObject, hash_batch
from ..store.uri import destination_label
from .destinations import check_binding, select_destinations
from .download import download_connections, download_range_size
from .keys import object_key
from .part_digests import FILENAME as PART_DIGESTS_FILENAME
from .part_digests import load_part_digests

log = logging.getLogger(__name__)

HEAD_WORKERS = 16
MiB = 1024 * 1024

# How much of the remote content is read: none (HEAD proofs only), the objects without a recorded
# server checksum, or all of them.
READ_NONE, READ_UNPROVEN, READ_ALL = "none", "unproven", "all"
# States that say the archive no longer holds the declared bytes (``unverifiable`` only lacks a proof).
DAMAGED = frozenset({"missing", "changed", "mismatch"})


@dataclass(frozen=True, slots=True)
class ObjectState:
    path: str
    key: str
    state: str  # ok | missing | changed | mismatch | unverifiable
    detail: str = ""
    checksum: str | None = None  # the server checksum HEAD reported (for the publisher to record)
    bytes_read: int = 0  # bytes read back and hashed (--read-data)

    def to_dict(self) -> dict[str, str]:
        out = {"path": self.path, "key": self.key, "state": self.state}
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass(frozen=True, slots=True)
class _ToRead:
    """An object whose HEAD passed and whose bytes are to be read and hashed before it is settled;
    ``replaced``: the recorded server checksum differs (the object was replaced), said if the bytes
    agree, since only reading them tells a replacement by identical bytes from a damaged object."""

    entry: FileEntry
    key: str
    checksum: str | None
    replaced: str = ""
    note: str = ""  # said of an object whose bytes, read back, are the declared ones


_NO_PROOF = ("no server checksum was recorded at publication (the endpoint computes none, or the receipt "
             "predates them) and user metadata proves nothing; --read-data hashes the bytes")


def _head_one(store: ObjectStore, prefix: str, entry: FileEntry, read: str, recorded: str | None,
              proof: bool) -> ObjectState | _ToRead:
    """HEAD one object; with ``proof`` (a receipt's check) it is ``ok`` only when a recorded server
    checksum is reported unchanged or its bytes are read and hashed (then a ``_ToRead``)."""
    key = object_key(prefix, entry.path)
    info = store.head(key)
    if info is None:
        return ObjectState(entry.path, key, "missing")
    if info.size != entry.size:
        return ObjectState(entry.path, key, "changed", f"size {info.size}, expected {entry.size}")
    if info.sha256 is None and read == READ_NONE:
        return ObjectState(entry.path, key, "unverifiable", "no sha256 metadata")
    if info.sha256 is not None and info.sha256 != entry.sha256:
        return ObjectState(entry.path, key, "changed", f"sha256 metadata {info.sha256}, expected {entry.sha256}")
    if info.checksum_sha256 is not None and info.checksum_sha256 != entry.sha256:
        return ObjectState(entry.path, key, "changed", f"server checksum {info.checksum_sha256}, expected {entry.sha256}")
    proven, replaced = False, ""
    if proof and recorded is not None:
        if info.checksum != recorded:
            found = "none" if info.checksum is None else info.checksum
            replaced = f"server checksum {found}, recorded {recorded} at publication: the object was replaced"
            if read != READ_ALL:
                return ObjectState(entry.path, key, "changed", replaced)
        proven = True
    if info.sha256 is None:  # bytes were asked for, and the receipt's declaration holds the digest: read them
        return _ToRead(entry, key, info.checksum, replaced, "no sha256 metadata; its bytes, read back, are the declared ones")
    if read == READ_ALL or (read == READ_UNPROVEN and not proven):
        return _ToRead(entry, key, info.checksum, replaced)
    if proof and not proven:
        return ObjectState(entry.path, key, "unverifiable", _NO_PROOF)
    return ObjectState(entry.path, key, "ok", checksum=info.checksum)


def _settle(todo: _ToRead, got: FileDigest | NotFound | VerificationFailed) -> ObjectState:
    """The state of an object read back: ``missing`` (gone since its HEAD), ``mismatch`` (its bytes are
    not the declared ones, or fewer), else ``ok`` (``changed`` when it was replaced by identical bytes)."""
    entry, key = todo.entry, todo.key
    if isinstance(got, NotFound):
        return ObjectState(entry.path, key, "missing", "gone since its HEAD")
    if isinstance(got, VerificationFailed):
        return ObjectState(entry.path, key, "mismatch", got.message)
    if got.sha256 != entry.sha256 or got.size != entry.size:
        return ObjectState(entry.path, key, "mismatch", f"content sha256 {got.sha256}, expected {entry.sha256}",
                           bytes_read=got.size)
    if todo.replaced:
        return ObjectState(entry.path, key, "changed", todo.replaced, bytes_read=got.size)
    return ObjectState(entry.path, key, "ok", todo.note, checksum=todo.checksum, bytes_read=got.size)


def _parts_of(parts: dict[str, PartDigests], entry: FileEntry) -> PartDigests | None:
    found = parts.get(entry.path)
    return found if found is not None and (found.size, found.sha256) == (entry.size, entry.sha256) else None


def _read_back(store: ObjectStore, todo: list[_ToRead], progress: bool | None,
               parts: dict[str, PartDigests] | None = None) -> list[ObjectState]:
    """Read and hash every ``todo`` object as one stream of ranges, with fetch's connections and range
    size (``transfer.hash_batch``): nothing is written, memory stays within the range window. An object
    with ``parts`` (declared part digests by path) is checked part by part instead."""
    if not todo:
        return []
    parts = parts or {}
    with ByteProgress(sum(t.entry.size for t in todo), "read", progress) as bar:
        got = hash_batch([HashedObject(t.entry.size, partial(store.open_range, t.key), t.key, bar,
                                       _parts_of(parts, t.entry)) for t in todo],
                         concurrency=download_connections(store), range_size=download_range_size(store))
    return [_settle(t, g) for t, g in zip(todo, got, strict=True)]


def check_remote_inventory(
    store: ObjectStore, prefix: str, entries: list[FileEntry] | tuple[FileEntry, ...], *, read_data: bool = False
) -> list[ObjectState]:
    """HEAD every entry under ``prefix`` concurrently (size, ``sha256`` metadata, a whole-object server
    checksum where reported); states in inventory order. Not a proof by itself: see ``check_receipt``."""
    return _check_all(store, prefix, entries, READ_ALL if read_data else READ_NONE, None)


def _check_all(store: ObjectStore, prefix: str, entries, read: str, recorded: dict[str, str] | None,
               proof: bool = False, progress: bool | None = False, declared=None) -> list[ObjectState]:
    """HEAD every entry concurrently, then read back (one stream) those that need their bytes hashed:
    part by part where ``declared`` (every file of the declaration) binds part digests. A part digests
    record that cannot be used gets a row of its own (replacing its entry's, when it is one)."""
    if not entries:
        return []
    checksums = recorded or {}
    with ThreadPoolExecutor(max_workers=min(HEAD_WORKERS, len(entries)), thread_name_prefix="verify") as pool:
        heads = list(pool.map(lambda e: _head_one(store, prefix, e, read, checksums.get(e.path), proof), entries))
    todo = [h for h in heads if isinstance(h, _ToRead)]
    parts, refused = _declared_parts(store, prefix, declared) if todo and declared is not None else ({}, None)
    read_back = iter(_read_back(store, todo, progress, parts))
    states = [next(read_back) if isinstance(h, _ToRead) else h for h in heads]
    if refused is not None:
        states = [s for s in states if s.path != PART_DIGESTS_FILENAME] + [refused]
    return states


def _declared_parts(store: ObjectStore, prefix: str, declared) -> tuple[dict[str, PartDigests], ObjectState | None]:
    """The part digests ``declared`` binds, or none and the row that says why its record was refused."""
    try:
        return load_part_digests(store, prefix, declared), None
    except CkptflowError as exc:
        state = "missing" if isinstance(exc, NotFound) else "mismatch"
        log.warning("%s; reading the objects whole", exc.message)
        return {}, ObjectState(PART_DIGESTS_FILENAME, object_key(prefix, PART_DIGESTS_FILENAME), state, exc.message)


def read_back(store: ObjectStore, prefix: str, entries: list[FileEntry], *, progress: bool | None = False
              ) -> list[ObjectState]:
    """Read and hash every entry's object whatever its metadata says (one stream of ranges, as
    ``--read-data`` reads): ``ok`` when its bytes are the entry's, ``mismatch`` or ``missing`` otherwise."""
    return _read_back(store, [_ToRead(e, object_key(prefix, e.path), None) for e in entries], progress)


def effective_read(store: ObjectStore, read: str) -> str:
    """``file://`` bytes are local: reading them is the cheap proof, so they are always read."""
    return READ_ALL if store.destination.scheme == "file" else read


@dataclass(frozen=True, slots=True)
class Subset:
    """Slice ``k`` of ``n`` of an archive's objects, for a scrub spread over ``n`` scheduled runs.

    An object is in slice ``1 + h % n``, where ``h`` is the first 8 bytes of the SHA-256 of its object
    key: the slices of ``1/n`` … ``n/n`` are disjoint and cover every object, and an object's slice
    depends on its own key only, so it stays the same from run to run while artifacts are published,
    pruned or fetched beside it (a sorted index would move every later object when one is added).
    Slices are even in expectation, not exactly.
    """

    k: int
    n: int

    @classmethod
    def parse(cls, text: str) -> Subset:
        k, sep, n = text.partition("/")
        if sep and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n):
            return cls(int(k), int(n))
        raise UsageError(f"subset {text!r} is not K/N with 1 <= K <= N", remedy="pass --subset 1/7 … 7/7")

    def holds(self, key: str) -> bool:
        return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % self.n == self.k - 1

    def __str__(self) -> str:
        return f"{self.k}/{self.n}"


def check_receipt(store: ObjectStore, receipt: receipt_record.Receipt, *, read: str = READ_NONE,
                  subset: Subset | None = None, progress: bool | None = False) -> list[ObjectState]:
    """The proof a receipt gives, the one check verify, prune-verified and publish --delete-local run:
    the declaration first, then every recorded file (those of ``subset`` only), in receipt order."""
    prefix = receipt.destination.prefix
    files = [f for f in receipt.files if subset is None or subset.holds(object_key(prefix, f.path))]
    states = [check_declaration(store, prefix, receipt.declaration_sha256)]
    return states + _check_all(store, prefix, files, effective_read(store, read), receipt.server_checksums,
                               proof=True, progress=progress, declared=receipt.files)


def check_declaration(store: ObjectStore, prefix: str, expected_sha256: str) -> ObjectState:
    """The remote declaration's bytes must hash to the digest the receipt (or staging record) binds."""
    key = object_key(prefix, declaration_record.FILENAME)
    info = store.head(key)
    if info is None:
        return ObjectState(declaration_record.FILENAME, key, "missing")
    data = store.get_bytes(key)
    got = sha256_bytes(data)
    if got != expected_sha256:
        return ObjectState(declaration_record.FILENAME, key, "changed", f"sha256 {got}, expected {expected_sha256}",
                           bytes_read=len(data))
    return ObjectState(declaration_record.FILENAME, key, "ok", bytes_read=len(data))


def describe_failures(states: list[ObjectState], limit: int = 5) -> str:
    """The objects that are not ok, as one line: ``key: state (detail); …`` and how many more."""
    bad = [s for s in states if s.state != "ok"]
    shown = "; ".join(f"{s.key}: {s.state}{' (' + s.detail + ')' if s.detail else ''}" for s in bad[:limit])
    return shown + (f" (+{len(bad) - limit} more)" if len(bad) > limit else "")


def require_all_ok(states: list[ObjectState], where: str) -> None:
    if any(s.state != "ok" for s in states):
        raise VerificationFailed(
            f"remote copy at {where} does not match its inventory: {describe_failures(states)}",
            remedy="the archive is damaged; keep the local copy and republish to a new destination",
        )


@dataclass(frozen=True)
class DestinationCheck:
    """The check of the copy at one more destination of a receipt: its objects, or why it could not run."""

    destination: receipt_record.ReceiptDestination
    objects: list[ObjectState]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(o.state == "ok" for o in self.objects)

    def to_dict(self) -> dict:
        out = {"destination": self.destination.to_dict(), "status": "verified" if self.ok else "failed",
               "objects": [o.to_dict() for o in self.objects]}
        return out | ({"detail": self.error} if self.error else {})

    def failure(self) -> str:
        where = destination_label(self.destination, self.destination.prefix)
        return f"{where}: {self.error or describe_failures(self.objects, limit=3)}"


@dataclass(frozen=True)
class VerifyResult:
    artifact_dir: Path
    receipt: receipt_record.Receipt  # as the proof for the first destination checked (``Receipt.at``)
    objects: list[ObjectState]
    read_data: bool = False
    receipt_sha256: str | None = None  # of the receipt's bytes that were checked
    subset: Subset | None = None
    seconds: float = 0.0
    scrub: bool = False  # the bytes were asked for (--read-data), so the report gives the time they took
    others: tuple[DestinationCheck, ...] = ()  # the other destinations checked (every one the receipt lists)

    @property
    def ok(self) -> bool:
        return all(o.state == "ok" for o in self.objects) and all(c.ok for c in self.others)

    @property
    def bytes_read(self) -> int:
        return sum(o.bytes_read for o in [*self.objects, *(o for c in self.others for o in c.objects)])

    def to_report(self) -> dict:
        """The ``verify`` report (schemas/report_verify.schema.json), for the CLI and the workflow alike."""
        return {
            "status": "verified" if self.ok else "failed",
            "artifact_dir": str(self.artifact_dir),
            "destination": self.receipt.destination.to_dict(),
            "read_data": self.read_data,
            "objects": [o.to_dict() for o in self.objects],
            **({"other_destinations": [c.to_dict() for c in self.others]} if self.others else {}),
            **read_figures(self.subset, self.bytes_read, self.seconds if self.scrub else None),
        }

    def failures(self) -> list[str]:
        """Each destination whose copy is not ok: ``<destination>: <what is wrong>``."""
        first = DestinationCheck(self.receipt.destination, self.objects)
        return [c.failure() for c in (first, *self.others) if not c.ok]

    def failure_line(self) -> str:
        if self._unproven_only():
            return (
                f"remote copy of {self.artifact_dir} is not proven by HEAD at {'; at '.join(self.failures())}; "
                "nothing seen differs from the receipt: prove it by its bytes with "
                f"`ckptflow verify --artifact-dir {self.artifact_dir} --read-data`"
            )
        return (
            f"remote copy of {self.artifact_dir} does not match its receipt at {'; at '.join(self.failures())}; "
            "keep the local copy and republish it to a new destination"
        )

    def _unproven_only(self) -> bool:
        """Every object not ok only lacks a proof (``unverifiable``) and every destination could be checked:
        the copy may well be whole, and reading it is the remedy, not republishing."""
        states = [*self.objects, *(o for c in self.others for o in c.objects)]
        return (not any(c.error for c in self.others) and any(o.state == "unverifiable" for o in states)
                and all(o.state in ("ok", "unverifiable") for o in states))


def read_figures(subset: Subset | None, bytes_read: int, seconds: float | None) -> dict:
    """The report's read figures: the slice, the bytes read back and hashed and, for a scrub (``seconds``
    given), the time and the throughput. A plain verify (on ``file://`` its bytes are read too) leaves the
    timings out, so the same archive gives the same report byte for byte."""
    figures = {"subset": None if subset is None else str(subset), "bytes_read": bytes_read}
    if seconds is not None:
        figures["seconds"] = round(seconds, 3)
        figures["throughput_mib_s"] = round(bytes_read / MiB / seconds, 1) if seconds else 0.0
    return figures


def verify_artifact(artifact_dir: Path | str, store_for, *, read_data: bool = False, subset: Subset | None = None,
                    progress: bool | None = False, record: bool = False,
                    destinations: list[str] | tuple[str, ...] | None = None) -> VerifyResult:
    """Check the remote objects recorded in ``artifact_dir/.uploaded`` (``check_receipt``) at every destination
    the receipt lists, or at those ``destinations`` names (``select_destinations``): the first one checked
    must be reachable (else this refuses), a later one that cannot be checked fails the result by name; on ``file://``
    the bytes are always read. ``subset`` (with ``read_data``): only the files of that slice. With ``record``
    (``ckptflow verify`` of one artifact, and the scrub of a runs root), the outcome is written to
    ``.verified.json`` beside the receipt, where ``status`` finds it: a whole check's, verified or failed,
    and a slice's only when it failed (damage in one slice is damage of the artifact; a clean slice proves
    nothing about the other files, so the previous outcome stands). The workflow's verify step writes
    its report too (its only output), and status's live check only looks.

    ``store_for(receipt_destination)`` returns the store for the receipt's scheme and bucket, opened
    with the caller's credentials; its endpoint must equal the receipt's.
    """
    artifact_dir = require_directory(artifact_dir, "artifact directory",
                                     "pass the published checkpoint_artifacts/iter_N directory")
    path = receipt_record.path_in(artifact_dir)
    if not path.exists():
        raise NotFound(f"{path} does not exist: the artifact has no upload receipt", remedy="run `ckptflow publish` first")
    full, receipt_sha256 = receipt_record.read_receipt_digest(artifact_dir)
    first, *rest = select_destinations(full, destinations, str(path))
    receipt = full.at(first)
    store = store_for(receipt.destination)
    check_binding(store, receipt, artifact_dir)
    read = effective_read(store, READ_ALL if read_data else READ_NONE)
    dest = receipt.destination
    log.info("verifying %s against %s://%s/%s at %s: %s", artifact_dir, dest.scheme, dest.bucket, dest.prefix,
             dest.endpoint, "reading and hashing every object" if read == READ_ALL
             else "HEAD: sizes and server checksums (sha256 metadata alone proves nothing)")
    started = time.monotonic()
    states = check_receipt(store, receipt, read=read, subset=subset, progress=progress)
    others = tuple(_check_at(artifact_dir, full.at(d), store_for, read_data, subset, progress) for d in rest)
    result = VerifyResult(artifact_dir=artifact_dir, receipt=receipt, objects=states, read_data=read == READ_ALL,
                          subset=subset, seconds=time.monotonic() - started, scrub=read_data,
                          receipt_sha256=receipt_sha256, others=others)
    if record and (subset is None or not result.ok):
        _record_outcome(result)
    return result


def _check_at(artifact_dir: Path, receipt: receipt_record.Receipt, store_for, read_data: bool,
              subset: Subset | None, progress: bool | None) -> DestinationCheck:
    """The copy at one more destination (``receipt`` as ``Receipt.at`` gives it); never raises for it."""
    try:
        store = store_for(receipt.destination)
        check_binding(store, receipt, artifact_dir)
        read = effective_read(store, READ_ALL if read_data else READ_NONE)
        return DestinationCheck(receipt.destination, check_receipt(store, receipt, read=read, subset=subset,
                                                                   progress=progress))
    except (CkptflowError, OSError) as exc:
        return DestinationCheck(receipt.destination, [], str(exc))


def _record_outcome(result: VerifyResult) -> None:
    """Write ``.verified.json``; a directory that cannot take it (read-only) costs only the record."""
    not_ok = sum(o.state != "ok" for o in [*result.objects, *(o for c in result.others for o in c.objects)])
    not_ok += sum(c.error is not None for c in result.others)
    outcome = verification_record.Verification(
        status="verified" if result.ok else "failed", verified_at=utc_timestamp(), read_data=result.read_data,
        objects=len(result.objects) + sum(len(c.objects) for c in result.others), not_ok=not_ok, receipt_sha256=result.receipt_sha256 or "")
    try:
        verification_record.write_verification(result.artifact_dir, outcome)
    except OSError as exc:
        log.warning("could not record the outcome in %s (%s): ckptflow status will not show this verification",
                    verification_record.path_in(result.artifact_dir), exc)
