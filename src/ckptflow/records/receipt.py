"""The upload receipt ``.uploaded``: proof that the remote copy of this artifact was verified.

Two kinds share the file name and protocol: the artifact receipt (below, class ``Receipt``) and the
full-checkpoint receipt (further below, class ``CheckpointReceipt``).

Written in the artifact directory after every remote object matched the declaration; it is what
``prune-verified`` requires before deleting local bytes::

    iter_0000300/
    ├── .posttrain-checkpoint-artifact.json
    ├── model.pt
    └── .uploaded          this record

    {
      "declaration_sha256": "<hex of the remote .posttrain-archive.json bytes>",
      "destination": {"bucket": "ckpts", "endpoint": "s3.example.org:9000", "prefix": "run1/iter_0000300",
                      "scheme": "s3"},
      "files": [{"path": "model.pt", "sha256": "<hex>", "size": 1234}, ...],
      "protocol": "posttrain.archive-marker.v1",
      "server_checksums": {"model.pt": "<base64>", "optim/__0_0.distcp": "<base64>-3", ...},
      "uploaded_at": "2025-01-31T12:00:00Z",
      "earlier_destinations": [{"bucket": "old-ckpts", "endpoint": "s3.example.org:9000",
                                "prefix": "run1/iter_0000300", "scheme": "s3"}]
    }

``server_checksums`` holds, per file, the checksum the endpoint itself computed and reported at
publication (S3 ``ChecksumSHA256``: whole-object, or ``-N`` composite of N parts) where it was shown to
be the checksum of the published bytes. A file without one (the endpoint computes none: GCS, file://,
servers without checksums) can be proven only by reading its bytes. The field is optional on read:
a receipt without it (written before it existed) proves no file by checksum.

``earlier_destinations`` (optional; absent when the artifact was only ever published to one place) lists,
newest first, the other destinations this artifact's receipt named before: publishing an artifact whose
receipt names another destination is refused unless the publication says it adds a destination
(``ckptflow publish --add-destination``), and then the receipt moves the old ``destination`` into this
list, so no record of where the archive lives is ever dropped. ``earlier_server_checksums`` (optional)
holds, in the same order, the ``server_checksums`` each earlier destination's publication recorded (null
for one that recorded none), so every copy keeps its proof. Verify and prune-verified check every
destination listed (or the ones the operator names); publication re-derives a lost receipt from any.

The endpoint is an authority (host[:port]; for ``file``, the archive root path) and never a secret:
a value with ``@``, ``?``, ``#`` or whitespace is refused on write and on read.

A *full-checkpoint* receipt (``"kind": "full-checkpoint"``, class ``CheckpointReceipt``) is the same
file in a full resumable checkpoint ``checkpoints/iter_N/``, written after its upload. Its bulk files
(uploaded once, under their own key: shards, ``trainer.pt``) carry their size only, never a digest, so
hashing a multi-GB save is never a second read; its transactional overrides (small files rewritten in
place under the same name, e.g. a ``latest`` pointer, where two versions may have the same size) carry
size and digest. No declaration, no server checksums; a path is a bulk file or an override, never both::

    {
      "destination": {"bucket": "ckpts", "endpoint": "s3.example.org:9000", "prefix": "run1/checkpoints/iter_0000300",
                      "scheme": "s3"},
      "files": [{"path": "model/__0_0.distcp", "size": 1234}, {"path": "trainer.pt", "size": 56}, ...],
      "kind": "full-checkpoint",
      "overrides": [{"path": "latest_checkpointed_iteration.txt", "sha256": "<hex>", "size": 3}],
      "protocol": "posttrain.archive-marker.v1",
      "uploaded_at": "2025-01-31T12:00:00Z"
    }

A full-checkpoint receipt written since identities were recorded also carries ``identities``: per bulk
file, ``{"ino", "size", "mtime_ns", "ctime_ns"}`` as observed when the receipt was written (and, when the
uploader passed them, equal to what it observed before reading the bytes). Retention requires each file
to still show exactly that identity (see ``ckptflow.trainer.retention``); a receipt without it proves
nothing newer than itself.

It satisfies full-checkpoint retention (``read_any_receipt``) and nothing else: ``read_receipt``, what
every artifact gate (verify, prune-verified, publish --delete-local) reads, refuses it by name
(``NotAnArtifactReceipt``), since a size proves no bytes.

A *legacy* ``.uploaded`` is a plain-text marker from older tooling (not JSON). It says an upload
happened but binds no digest, so it can never authorize pruning: ``read_receipt`` and ``read_any_receipt``
refuse it by name (``LegacyRecord``); full-checkpoint retention accepts it by its existence alone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..digest import sha256_bytes
from ..errors import CkptflowError, InvalidRecord, Refused
from ..jsonio import decode_json_object
from . import _record
from . import manifest as manifest_record
from .inventory import FileEntry, inventory_from_list, inventory_to_list, sorted_entries, validate_inventory

FILENAME = ".uploaded"
PROTOCOL = "posttrain.archive-marker.v1"
FULL_CHECKPOINT = "full-checkpoint"
_LEGACY_REMEDY = (
    "a legacy marker cannot authorize pruning; publish or verify the artifact again to write a "
    f"{PROTOCOL} receipt"
)

def _check_destinations(obj: Mapping[str, Any], what: str) -> None:
    """Every endpoint a receipt names (current and earlier) is checked before the schema could echo one."""
    _record.check_destination(obj, what)
    earlier = obj.get("earlier_destinations")
    for dest in earlier if isinstance(earlier, list) else ():
        if isinstance(dest, Mapping) and "endpoint" in dest:
            _record.check_endpoint(dest["endpoint"], what, "earlier_destinations[].endpoint")


KIND = _record.RecordKind(
    filename=FILENAME,
    schema="receipt",
    protocol=PROTOCOL,
    legacy_remedy=_LEGACY_REMEDY,
    precheck=_check_destinations,
)


class NotAnArtifactReceipt(InvalidRecord):
    """A valid full-checkpoint receipt where an artifact receipt is required: it binds no digest to bulk bytes."""


@dataclass(frozen=True, slots=True)
class ReceiptDestination(_record.Flat):
    """Where the archive lives: the non-secret identity of the store plus the artifact's key prefix."""

    scheme: str
    endpoint: str
    bucket: str
    prefix: str

    @classmethod
    def at(cls, destination: Any, prefix: str) -> ReceiptDestination:
        """From a store's ``Destination`` (anything with scheme, endpoint and bucket) and a key prefix."""
        return cls(
            scheme=destination.scheme, endpoint=destination.endpoint, bucket=destination.bucket, prefix=prefix
        )


@dataclass(frozen=True, slots=True)
class Receipt:
    destination: ReceiptDestination
    declaration_sha256: str
    files: tuple[FileEntry, ...]
    uploaded_at: str
    # path -> server checksum recorded at publication; None: an older receipt that records none.
    server_checksums: Mapping[str, str] | None = None
    # Other destinations this artifact was published to before, newest first (see the module docstring).
    earlier_destinations: tuple[ReceiptDestination, ...] = ()
    # The server checksums each earlier destination's publication recorded, in the same order (None: none);
    # () for a receipt that records none for any.
    earlier_server_checksums: tuple[Mapping[str, str] | None, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", sorted_entries(self.files))
        if self.server_checksums is not None:
            object.__setattr__(self, "server_checksums", dict(sorted(self.server_checksums.items())))

    def entry(self, path: str) -> FileEntry | None:
        return next((e for e in self.files if e.path == path), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> Receipt:
        _record.check_object(KIND, data, what)
        if "kind" in data:
            raise NotAnArtifactReceipt(
                f"{what} is a {data['kind']} receipt: its {len(data['files'])} bulk files carry a size and no "
                "digest, so it proves no artifact's bytes and cannot authorize verify, pruning or --delete-local",
                remedy="publish the artifact (`ckptflow publish` or `snakemake publish_all`) to write an artifact "
                "receipt; a full-checkpoint receipt satisfies only retain-checkpoints",
            )
        return cls(
            destination=_destination(data["destination"]),
            declaration_sha256=_record.require_sha256(data["declaration_sha256"], what, "declaration_sha256"),
            files=inventory_from_list(data["files"], what),
            uploaded_at=_record.require_utc_timestamp(data["uploaded_at"], what, "uploaded_at"),
            server_checksums=_checksums(data, what),
            earlier_destinations=tuple(_destination(d) for d in data.get("earlier_destinations", ())),
            earlier_server_checksums=_earlier_checksums(data, what),
        )

    def checksums_at(self, destination: ReceiptDestination) -> Mapping[str, str] | None:
        """The server checksums the publication to ``destination`` recorded; None when it recorded none."""
        if destination == self.destination:
            return self.server_checksums
        recorded = dict(zip(self.earlier_destinations, self.earlier_server_checksums, strict=False))
        return recorded.get(destination)

    def at(self, destination: ReceiptDestination) -> Receipt:
        """This receipt as the proof for the copy at ``destination`` (one it lists): that destination, with
        the server checksums its publication recorded; what verify checks there."""
        if destination not in self.destinations:
            raise ValueError(f"{destination} is not a destination of this receipt")
        return Receipt(destination, self.declaration_sha256, self.files, self.uploaded_at,
                       self.checksums_at(destination))

    @property
    def destinations(self) -> tuple[ReceiptDestination, ...]:
        """Every destination this receipt records: the current one first, then the earlier ones."""
        return (self.destination, *self.earlier_destinations)

    def to_dict(self) -> dict[str, Any]:
        out = {
            "protocol": PROTOCOL,
            "destination": self.destination.to_dict(),
            "declaration_sha256": self.declaration_sha256,
            "files": inventory_to_list(self.files),
            "uploaded_at": self.uploaded_at,
        }
        if self.server_checksums is not None:
            out["server_checksums"] = dict(self.server_checksums)
        if self.earlier_destinations:
            out["earlier_destinations"] = [d.to_dict() for d in self.earlier_destinations]
        if any(c is not None for c in self.earlier_server_checksums):
            out["earlier_server_checksums"] = [None if c is None else dict(sorted(c.items()))
                                               for c in self.earlier_server_checksums]
        return out


@dataclass(frozen=True, slots=True)
class FileIdentity(_record.Flat):
    """What ``lstat`` shows of a file: inode, size, modification and change time (nanoseconds)."""

    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path | str) -> FileIdentity:
        st = os.lstat(path)
        return cls(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass(frozen=True, slots=True)
class CheckpointReceipt:
    """A full checkpoint's receipt: bulk ``files`` with size only (``sha256`` None), ``overrides`` with digests."""

    destination: ReceiptDestination
    files: tuple[FileEntry, ...]
    overrides: tuple[FileEntry, ...]
    uploaded_at: str
    # bulk path -> identity observed at the upload; None: a receipt written before identities were recorded.
    identities: Mapping[str, FileIdentity] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", sorted_entries(self.files))
        object.__setattr__(self, "overrides", sorted_entries(self.overrides))
        if self.identities is not None:
            object.__setattr__(self, "identities", dict(sorted(self.identities.items())))

    def entry(self, path: str) -> FileEntry | None:
        return next((e for e in (*self.files, *self.overrides) if e.path == path), None)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> CheckpointReceipt:
        _record.check_object(KIND, data, what)
        if data.get("kind") != FULL_CHECKPOINT:
            raise InvalidRecord(
                f"{what} is an artifact receipt, not a {FULL_CHECKPOINT} receipt",
                remedy="read it with read_receipt, or write the checkpoint's receipt with write_checkpoint_receipt",
            )
        bulk = inventory_from_list(data["files"], what, require_digest=False)
        overrides = inventory_from_list(data["overrides"], what)
        validate_inventory((*bulk, *overrides), what, require_digest=False)  # no path both bulk and override
        return cls(
            destination=_destination(data["destination"]),
            files=bulk,
            overrides=overrides,
            uploaded_at=_record.require_utc_timestamp(data["uploaded_at"], what, "uploaded_at"),
            identities=_identities(data, bulk, what),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "kind": FULL_CHECKPOINT,
            "destination": self.destination.to_dict(),
            "files": inventory_to_list(self.files),
            "overrides": inventory_to_list(self.overrides),
            "uploaded_at": self.uploaded_at,
            **({"identities": {p: i.to_dict() for p, i in self.identities.items()}}
               if self.identities is not None else {}),
        }


def _destination(dest: Mapping[str, str]) -> ReceiptDestination:
    return ReceiptDestination(
        scheme=dest["scheme"], endpoint=dest["endpoint"], bucket=dest["bucket"], prefix=dest["prefix"]
    )


def _identities(data: Mapping[str, Any], bulk: tuple[FileEntry, ...], what: str) -> dict[str, FileIdentity] | None:
    """``identities`` (schema-checked): exactly the bulk files, each of its recorded size; None when absent."""
    if "identities" not in data:
        return None
    found = {p: FileIdentity(**v) for p, v in data["identities"].items()}
    sizes = {e.path: e.size for e in bulk}
    if set(found) != set(sizes) or any(found[p].size != sizes[p] for p in sizes):
        raise InvalidRecord(
            f"{what}: identities do not match its bulk files (paths or sizes differ)",
            remedy="the receipt is corrupt; upload the checkpoint again and rewrite its receipt",
        )
    return found


def _checksums(data: Mapping[str, Any], what: str) -> dict[str, str] | None:
    """``server_checksums`` (schema-checked), every key a file of the receipt; None when absent."""
    if "server_checksums" not in data:
        return None
    checksums = dict(data["server_checksums"])
    paths = {f["path"] for f in data["files"]}
    unknown = sorted(set(checksums) - paths)
    if unknown:
        raise InvalidRecord(
            f"{what}: server_checksums names {unknown[:5]}, which are not among its files",
            remedy="the receipt is corrupt; publish or verify the artifact again to rewrite it",
        )
    return checksums


def _earlier_checksums(data: Mapping[str, Any], what: str) -> tuple[dict[str, str] | None, ...]:
    """``earlier_server_checksums`` (schema-checked): one entry per earlier destination, each key a file."""
    if "earlier_server_checksums" not in data:
        return ()
    listed = data["earlier_server_checksums"]
    if len(listed) != len(data.get("earlier_destinations", ())):
        raise InvalidRecord(
            f"{what}: earlier_server_checksums has {len(listed)} entries for "
            f"{len(data.get('earlier_destinations', ()))} earlier destinations",
            remedy="the receipt is corrupt; publish or verify the artifact again to rewrite it",
        )
    return tuple(None if c is None else _checksums({"server_checksums": c, "files": data["files"]}, what)
                 for c in listed)


# Both kinds of receipt are encoded and written by this one binding; parsing picks the kind (below).
_FILE = _record.RecordFile(KIND, Receipt)
path_in = KIND.path_in


def _looks_legacy(data: bytes) -> bool:
    # A BOM before "{" is a broken JSON receipt (refused by name as such), not a legacy marker.
    return not data.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n").startswith(b"{")


def is_legacy_receipt(source: Path | str) -> bool:
    """True when ``.uploaded`` exists in ``source`` (or is the file ``source``) and is not JSON."""
    path = _record.record_path(source, FILENAME)
    try:
        return _looks_legacy(path.read_bytes())
    except (FileNotFoundError, IsADirectoryError):
        return False


def belonging_receipt(artifact_dir: Path | str) -> Receipt | None:
    """The artifact receipt in ``artifact_dir`` when it is this artifact's (``check_belongs``), else None:
    missing, unreadable, legacy, a full-checkpoint receipt or another artifact's all leave the artifact
    pending publication. Reads two small files; never contacts a store."""
    try:
        receipt = read_receipt(artifact_dir)
        check_belongs(receipt, artifact_dir)
    except (CkptflowError, OSError):
        return None
    return receipt


def _decode(data: bytes, what: str) -> dict[str, Any]:
    if _looks_legacy(data):
        raise _record.LegacyRecord(
            f"{what} is a legacy plain-text marker, not a {PROTOCOL} receipt", remedy=_LEGACY_REMEDY
        )
    return decode_json_object(data, what=what)


def parse_receipt(data: bytes, *, what: str = FILENAME) -> Receipt:
    """An artifact receipt; a legacy marker (``LegacyRecord``) and a full-checkpoint receipt
    (``NotAnArtifactReceipt``) are refused by name."""
    return Receipt.from_dict(_decode(data, what), what=what)


def parse_any_receipt(data: bytes, *, what: str = FILENAME) -> Receipt | CheckpointReceipt:
    """Either kind, by its ``kind`` field; a legacy marker is still refused (``LegacyRecord``)."""
    obj = _decode(data, what)
    return (CheckpointReceipt if "kind" in obj else Receipt).from_dict(obj, what=what)


def read_receipt(source: Path | str) -> Receipt:
    """The artifact receipt every artifact gate requires (see ``parse_receipt``)."""
    return _record.read_record(KIND, source, parse_receipt)


def read_receipt_digest(source: Path | str) -> tuple[Receipt, str]:
    """``read_receipt`` and the SHA-256 of the very bytes it parsed (what a verification is bound to)."""
    return _record.read_record(KIND, source, lambda data, what: (parse_receipt(data, what=what), sha256_bytes(data)))


def read_any_receipt(source: Path | str) -> Receipt | CheckpointReceipt:
    """An artifact or a full-checkpoint receipt (what full-checkpoint retention accepts)."""
    return _record.read_record(KIND, source, parse_any_receipt)


# write_receipt writes an artifact receipt only after the remote copy was verified against the
# declaration, a full-checkpoint receipt only after the checkpoint's upload finished.
encode_receipt = _FILE.encode
write_receipt = _FILE.write


def check_belongs(receipt: Receipt, artifact_dir: Path | str, *, expected_prefix: str | None = None,
                  manifest: tuple[bytes, manifest_record.Manifest] | None = None) -> None:
    """Refuse (``Refused``) a receipt that was not written for the artifact in ``artifact_dir``: the one
    check every reader of a receipt runs before it trusts one (verify, prune-verified, status, the
    workflow's choice of a teacher's source). Reads only the small local manifest; no store, no payload.

    The receipt belongs when its prefix ends in this directory's name (``iter_N``) and, where the caller's
    layout derives the prefix (the workflow: ``<run>/checkpoint_artifacts/iter_N``), equals
    ``expected_prefix``; it records the digest of this directory's manifest (``manifest``: its bytes and
    record, when the caller has read them already); and that manifest is of iteration N. A copied ``.uploaded``
    of another iteration or run fails the first or second test, whatever its mtime.
    """
    artifact_dir = Path(artifact_dir)
    where = path_in(artifact_dir)
    prefix = receipt.destination.prefix
    remedy = ("publish this artifact (`ckptflow publish --artifact-dir DIR`) to write its own receipt, "
              "or restore the receipt that publication wrote here")
    if prefix.rstrip("/").rsplit("/", 1)[-1] != artifact_dir.name or (
            expected_prefix is not None and prefix.strip("/") != expected_prefix.strip("/")):
        wanted = expected_prefix.strip("/") if expected_prefix is not None else f".../{artifact_dir.name}"
        raise Refused(f"{where} records the archive at {prefix}, not {wanted}: it was written for another artifact",
                      path=str(where), remedy=remedy)
    local = manifest_record.path_in(artifact_dir)
    try:
        data = local.read_bytes() if manifest is None else manifest[0]
        iteration = (manifest_record.parse_manifest(data, what=str(local)) if manifest is None else manifest[1]).iteration
    except (OSError, ValueError) as exc:
        raise Refused(f"{where} cannot be bound to {local}: {exc}", path=str(where),
                      remedy="restore the artifact's manifest, or publish the artifact again") from None
    recorded = receipt.entry(manifest_record.FILENAME)
    number = re.fullmatch(r"iter_(\d+)", artifact_dir.name)
    if recorded is None or recorded.sha256 != sha256_bytes(data):
        found = "no manifest" if recorded is None else f"manifest sha256 {recorded.sha256}"
        raise Refused(f"{where} records {found} at {prefix}, not the sha256 {sha256_bytes(data)} of {local}: "
                      "it was written for another artifact", path=str(where), remedy=remedy)
    if number is None or int(number.group(1)) != iteration:
        raise Refused(f"{local} is the manifest of iteration {iteration}, not of the directory {artifact_dir.name} "
                      f"that {where} was written for", path=str(where), remedy=remedy)
