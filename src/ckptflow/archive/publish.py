"""``publish_artifact``: archive a committed local artifact under an immutable, digest-bound inventory.

Order (each step is safe to interrupt; a rerun resumes or refuses by name):

1. Select the files: the manifest's physical components (every DCP shard), the merge completion
   record, a preserved legacy manifest, and the diagnostic the merge record names if it lies inside
   the artifact. Nothing else (a stale unselected ``optim.pt`` stays out).
2. Hash each selected file once. A digest that contradicts the manifest is refused before anything
   remote happens; missing ``file`` component digests are added to the local manifest (atomically).
   The same pass takes the BLAKE3 part digests; their record is declared like an archived file and
   written beside the manifest (``write_part_digests``) just before the declaration is created (or,
   for an archive adopted or already recorded, once it is verified). An artifact archived before part
   digests existed (its receipt or the remote declaration binds the declaration without them) keeps
   that form (``declared_form``), so publishing it again stays a resume.
3. Judge what a prefix without a declaration already holds (``judge_undeclared``: another tool's upload,
   say): an object with a declared file's size and SHA-256 (its metadata, or its bytes read) is adopted;
   any other object is refused by key, before anything is written. Then create the declaration
   ``.posttrain-archive.json`` with a create-once PUT. An identical one means resume; a different one is
   refused before a payload is written. It is never deleted or replaced.
4. Give each object adopted by its bytes read its ``sha256`` metadata in place (``file://``: the sidecar;
   S3: a server-side copy onto itself from the ETag that was read), never sending or changing its bytes.
   Upload every declared payload not already present with the declared size and sha256; HEAD-verify.
   On S3 an unfinished multipart upload a killed run left for the same bytes is resumed: only its parts
   not proven (server checksum = this hashing pass's digest of the range) are sent (``store/s3_uploads.py``).
5. Commit the manifest remotely (create-once; an existing one must be byte-identical), verify the
   whole remote inventory, abort the unfinished uploads under the prefix that no live process uses,
   then write the local ``.uploaded`` receipt.

A remote manifest means a committed archive: it is adopted (verified, receipt written) when it matches
the local inventory, and refused when it does not. An artifact whose payloads were pruned locally can
still be adopted: the manifest's digests stand in for the missing files, and the remote declaration and
manifest must equal the local ones byte for byte (nothing is written remotely), so the receipt is always
re-derivable from the manifest and the archive; without such an archive it is refused by name. The
receipt records the server checksums the endpoint reported for the published bytes. ``delete_local``
removes the manifest's payload files only through ``release`` (the checks prune-verified runs: receipt
bound to the artifact, payloads re-hashed by descriptor, the live remote copy proven by server checksum
or by reading it back, each file unlinked only if it is still the one hashed), and only on an endpoint
with a passing probe record (``probe.require_qualified``). A ``file://`` archive root that overlaps the
artifact is refused.

An artifact whose receipt names another destination is refused before anything is read or written
(the receipt may be the only record of where the archive lives), unless ``add_destination`` says the
artifact is archived at this destination as well: the new receipt then keeps the earlier destinations
(``earlier_destinations``). Any receipt this function rewrites keeps them.

Modules: this one talks to the store (steps 3–5) and writes the receipt; ``publish_inventory.py`` builds
the local inventory (steps 1–2); ``adopt.py`` judges what the destination already holds (step 3, a pruned
artifact's archive, the declared form); ``destinations.py`` owns the overlap check and the earlier
destinations a receipt keeps; ``publish_plan.py`` is the dry run.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .. import testhooks
from ..artifact import clear_stale_merge_marker, merge_in_progress
from ..digest import FileDigest, sha256_bytes
from ..errors import ConflictError, NotFound, Refused
from ..fsutil import atomic_write_bytes
from ..progress import ByteProgress
from ..records import declaration as declaration_record
from ..records import manifest as manifest_record
from ..records import merge_progress, merge_record, utc_timestamp
from ..records import part_digests as part_digests_record
from ..records import receipt as receipt_record
from ..records.inventory import FileEntry
from ..store.base import DEFAULT_MULTIPART_THRESHOLD, ObjectStore, UploadLog, server_checksums_of
from .adopt import adopt_pruned, adopt_read_objects, declared_form, judge_undeclared_objects
from .destinations import earlier_destinations, refuse_overlapping_archive
from .keys import artifact_prefix, object_key, upload_prefix_for
from .publish_inventory import LocalInventory, build_local_inventory
from .verify import READ_UNPROVEN, ObjectState, check_declaration, check_remote_inventory, require_all_ok

log = logging.getLogger(__name__)

SMALL_FILE_WORKERS = 8
# An unfinished upload under the archive's prefix that this machine's journal does not name is aborted
# only once it is older than this: it may belong to a live publisher on another machine.
DEFAULT_STALE_UPLOAD_AGE = 24 * 3600.0


@dataclass
class PublishResult:
    status: str  # published | adopted | skipped
    artifact_dir: Path
    destination: receipt_record.ReceiptDestination
    inventory: tuple[FileEntry, ...]
    declaration_sha256: str
    uploaded: list[str] = field(default_factory=list)
    uploaded_bytes: int = 0
    removed: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    held: list[dict] = field(default_factory=list)  # removed payloads whose bytes stay under another name
    sent_bytes: int = 0
    resumed_uploads: list[dict] = field(default_factory=list)
    aborted_uploads: list[dict] = field(default_factory=list)
    earlier_destinations: tuple[receipt_record.ReceiptDestination, ...] = ()
    adopted_objects: list[dict] = field(default_factory=list)

    def to_report(self) -> dict:
        earlier = {"earlier_destinations": [d.to_dict() for d in self.earlier_destinations]} if self.earlier_destinations else {}
        if self.adopted_objects:
            earlier["adopted_objects"] = self.adopted_objects
        if self.held:
            earlier["held"] = self.held
        return {
            "status": self.status,
            "artifact_dir": str(self.artifact_dir),
            "destination": self.destination.to_dict(),
            "declaration_sha256": self.declaration_sha256,
            "inventory": [e.to_dict() for e in self.inventory],
            "uploaded": self.uploaded,
            "uploaded_bytes": self.uploaded_bytes,
            "removed": self.removed,
            "freed_bytes": self.freed_bytes,
            "sent_bytes": self.sent_bytes,
            "resumed_uploads": self.resumed_uploads,
            "aborted_uploads": self.aborted_uploads,
            **earlier,
        }


def refuse_merge_in_progress(artifact_dir: Path) -> None:
    """Before any read or write of the archive: a merge in progress (or killed) is not committed."""
    if merge_in_progress(artifact_dir):
        raise Refused(
            f"{artifact_dir} holds {merge_progress.FILENAME} and no {merge_record.FILENAME}: a merge is writing it "
            "or was killed while it did, so it is not a committed artifact; nothing was uploaded",
            path=str(artifact_dir), remedy="let the merge finish, or rerun the same merge to complete it, then publish")


# --------------------------------------------------------------------------------------------- remote


def _create_or_match_declaration(store: ObjectStore, prefix: str, inv: LocalInventory) -> None:
    key = object_key(prefix, declaration_record.FILENAME)
    if store.put_bytes_create_once(key, inv.declaration_bytes, sha256=sha256_bytes(inv.declaration_bytes)):
        return
    existing = store.get_bytes(key)
    if existing != inv.declaration_bytes:
        raise Refused(
            f"{store.destination.uri(key)} already declares different contents "
            f"(remote declaration sha256 {sha256_bytes(existing)}, this artifact's {sha256_bytes(inv.declaration_bytes)})",
            remedy="a declaration is permanent and is never replaced; publish this artifact to another destination",
        )
    log.info("declaration at %s matches; resuming", key)


def _upload_payloads(
    store: ObjectStore, prefix: str, artifact_dir: Path, entries: list[FileEntry], progress: bool | None,
    digests: dict[str, FileDigest], uploads: UploadLog | None = None,
) -> tuple[list[str], int]:
    todo: list[FileEntry] = []
    for entry, state in zip(entries, check_remote_inventory(store, prefix, entries), strict=True):
        if state.state != "ok":
            todo.append(entry)
    total = sum(e.size for e in todo)
    uploaded: list[str] = []
    with ByteProgress(total, "publish upload", progress) as bar:
        def stored(_key: str) -> None:  # reached once per payload object, by whichever thread stored it
            testhooks.reached("publish:after-payload", subject=prefix)

        def upload(entry: FileEntry) -> str:
            store.put_file(
                object_key(prefix, entry.path), artifact_dir / entry.path,
                digest=FileDigest(entry.size, entry.sha256), progress=bar,
            )
            stored(entry.path)
            return entry.path

        # Large files go as one stream of concurrent parts (memory stays bounded by the store's part
        # window, and no file boundary idles the connections); small files go concurrently, since
        # each is one request.
        threshold = store.multipart.threshold if store.multipart is not None else DEFAULT_MULTIPART_THRESHOLD
        large = [e for e in todo if e.size >= threshold]
        small = [e for e in todo if e.size < threshold]
        if large:
            resume = {"uploads": uploads} if uploads is not None else {}
            store.put_files([(object_key(prefix, e.path), artifact_dir / e.path, _digest_of(e, digests))
                             for e in large], progress=bar, on_stored=stored, **resume)
        if uploads is not None:
            uploads.sent(sum(e.size for e in small))
        uploaded = [e.path for e in large]
        if small:
            with ThreadPoolExecutor(max_workers=min(SMALL_FILE_WORKERS, len(small)), thread_name_prefix="upload") as pool:
                uploaded += list(pool.map(upload, small))
        uploaded.sort()
    return uploaded, total


def _digest_of(entry: FileEntry, digests: dict[str, FileDigest]) -> FileDigest:
    """The entry's digest, with the hashing pass's per-part digests when they are of these bytes."""
    hashed = digests.get(entry.path)
    if hashed is not None and hashed == FileDigest(entry.size, entry.sha256):
        return hashed
    return FileDigest(entry.size, entry.sha256)


def _commit_manifest(store: ObjectStore, prefix: str, inv: LocalInventory) -> None:
    key = object_key(prefix, manifest_record.FILENAME)
    if store.put_bytes_create_once(key, inv.manifest_bytes, sha256=inv.declaration.manifest_sha256):
        return
    if store.get_bytes(key) != inv.manifest_bytes:
        raise ConflictError(
            f"{key} is already committed with different bytes than {manifest_record.FILENAME}",
            remedy="the destination holds another artifact; publish to another destination",
        )


def write_part_digests(artifact_dir: Path, inv: LocalInventory) -> None:
    """Put the part digests record ``inv`` declares beside the manifest (the payload upload sends it from
    there); nothing is written when the file already holds those bytes. A file with other bytes is
    replaced: the record is derived data, rebuilt in this pass from the files (and, for pruned payloads,
    from that file's own entries), so nothing it held is lost."""
    if inv.part_digests_bytes is None:
        return
    path = part_digests_record.path_in(artifact_dir)
    try:
        if path.read_bytes() == inv.part_digests_bytes:
            return
    except FileNotFoundError:
        pass
    atomic_write_bytes(path, inv.part_digests_bytes)


def receipt_matches(artifact_dir: Path, dest: receipt_record.ReceiptDestination, decl_sha: str, inv: LocalInventory) -> bool:
    path = receipt_record.path_in(artifact_dir)
    if not path.exists() or receipt_record.is_legacy_receipt(artifact_dir):
        return False
    try:
        rec = receipt_record.read_receipt(artifact_dir)
    except (ValueError, OSError) as exc:
        log.warning("ignoring unreadable receipt %s: %s", path, exc)
        return False
    return rec.destination == dest and rec.declaration_sha256 == decl_sha and rec.files == inv.files


def check_destination(artifact_dir: Path, store: ObjectStore, upload_prefix: str | None,
                      add_destination: bool) -> tuple[str, receipt_record.ReceiptDestination, tuple]:
    """The checks a publication (and its dry run) makes before its first read of a payload: the artifact
    exists and no merge is in progress in it, the prefix (derived, or an explicit one that agrees), an
    archive that does not overlap the artifact, and a receipt naming another destination refused unless
    ``add_destination``. Returns the artifact's prefix, its destination and the earlier destinations."""
    if not artifact_dir.is_dir():
        raise NotFound(f"artifact directory {artifact_dir} does not exist", remedy="check --artifact-dir")
    refuse_merge_in_progress(artifact_dir)
    prefix = artifact_prefix(upload_prefix_for(artifact_dir, upload_prefix), artifact_dir.name)
    dest = receipt_record.ReceiptDestination.at(store.destination, prefix)
    refuse_overlapping_archive(store, artifact_dir)
    return prefix, dest, earlier_destinations(artifact_dir, dest, add_destination)


def publish_artifact(
    artifact_dir: Path | str,
    store: ObjectStore,
    upload_prefix: str | None,
    *,
    delete_local: bool = False,
    progress: bool | None = None,
    stale_upload_age: float = DEFAULT_STALE_UPLOAD_AGE,
    add_destination: bool = False,
) -> PublishResult:
    """Publish one artifact; the one function the CLI, the workflow and trainers call.

    On a store that journals its multipart uploads (S3), an unfinished upload a killed run left for the
    same bytes is resumed, and once the archive is verified the unfinished uploads under its prefix that
    no live process uses are aborted: those this machine's journal names, and any other older than
    ``stale_upload_age`` seconds (``_clean_uploads``). ``upload_prefix`` None: derived from the artifact's
    path; an explicit one that would archive it elsewhere is refused (``keys.upload_prefix_for``)."""
    artifact_dir = Path(artifact_dir)
    prefix, dest, earlier = check_destination(artifact_dir, store, upload_prefix, add_destination)
    clear_stale_merge_marker(artifact_dir)  # a merge killed after its record left it: never archived, never kept
    if delete_local:
        from .probe import require_qualified

        require_qualified(store, prefix)  # before any remote write: fail closed on unqualified endpoints

    resumable = store.multipart.resumable if store.multipart is not None else None
    uploads = UploadLog() if resumable is not None else None
    inv = build_local_inventory(
        artifact_dir, progress=progress, part_size_for=store.part_digest_size,
        md5_parts_for=(lambda rel, size: resumable.resumable_part_size(object_key(prefix, rel), size))
        if resumable else None)
    inv = declared_form(store, prefix, artifact_dir, inv)
    decl_sha = sha256_bytes(inv.declaration_bytes)
    result = PublishResult("published", artifact_dir, dest, inv.files, decl_sha, earlier_destinations=earlier)

    if receipt_matches(artifact_dir, dest, decl_sha, inv):
        result.status = "skipped"
    elif inv.pruned:
        result.status = "adopted"
        adopt_pruned(store, prefix, artifact_dir, inv)
    elif store.head(object_key(prefix, manifest_record.FILENAME)) is not None:
        result.status = "adopted"
        # A committed archive: compare before writing anything, so a conflicting prefix is refused
        # untouched. With a declaration, that comparison names both declaration digests; a legacy
        # prefix without one is compared on its manifest before a declaration is added.
        if store.head(object_key(prefix, declaration_record.FILENAME)) is not None:
            _create_or_match_declaration(store, prefix, inv)
            _commit_manifest(store, prefix, inv)
        else:
            _commit_manifest(store, prefix, inv)
            _create_or_match_declaration(store, prefix, inv)
    else:
        result.adopted_objects, read_etags = judge_undeclared_objects(store, prefix, inv)
        write_part_digests(artifact_dir, inv)  # uploaded from there with the payloads
        _create_or_match_declaration(store, prefix, inv)
        testhooks.reached("publish:after-declaration")
        adopt_read_objects(store, prefix, inv, read_etags)
        payloads = [e for e in inv.files if e.path != manifest_record.FILENAME]
        result.uploaded, result.uploaded_bytes = _upload_payloads(store, prefix, artifact_dir, payloads, progress,
                                                                  inv.digests, uploads)
        testhooks.reached("publish:before-manifest")
        _commit_manifest(store, prefix, inv)

    where = str(store.destination.uri(prefix))
    states = [check_declaration(store, prefix, decl_sha), *check_remote_inventory(store, prefix, inv.files)]
    require_all_ok(states, where)
    write_part_digests(artifact_dir, inv)  # an adopted or skipped archive's record, kept beside its manifest
    _clean_uploads(store, prefix, stale_upload_age, uploads, result)
    kept = receipt_record.read_receipt(artifact_dir) if result.status == "skipped" else None
    if kept is None or kept.server_checksums is None or kept.earlier_destinations != earlier:
        testhooks.reached("publish:before-receipt")
        previous = receipt_record.belonging_receipt(artifact_dir)  # each earlier copy keeps its proof
        receipt = receipt_record.Receipt(
            destination=dest, declaration_sha256=decl_sha, files=inv.files,
            uploaded_at=utc_timestamp(), server_checksums=_proven_checksums(states[1:], inv),
            earlier_destinations=earlier,
            earlier_server_checksums=tuple(previous.checksums_at(d) if previous is not None else None for d in earlier),
        )
        receipt_record.write_receipt(artifact_dir, receipt)
    if delete_local:
        result.removed, result.freed_bytes, result.held = delete_verified_payloads(artifact_dir, inv.manifest, store,
                                                                                   progress)
    return result


def _clean_uploads(store: ObjectStore, prefix: str, stale_age: float, uploads: UploadLog | None,
                   result: PublishResult) -> None:
    """The archive is verified: abort the unfinished uploads under its prefix that no live process uses
    (none can still be needed), and put in the report what was resumed, aborted and sent."""
    result.sent_bytes = result.uploaded_bytes
    if uploads is None:
        return
    aborted, kept = store.multipart.resumable.sweep_uploads(prefix + "/", older_than=stale_age, journaled_any_age=True)
    for row in kept:
        log.info("%s: left unfinished upload %s alone: %s", row["key"], row["upload_id"], row["reason"])
    rel = len(prefix) + 1
    result.sent_bytes = uploads.sent_bytes
    result.resumed_uploads = [{"path": r["key"][rel:], "upload_id": r["upload_id"], "reused_parts": r["reused_parts"],
                               "reused_bytes": r["reused_bytes"]} for r in uploads.resumed]
    result.aborted_uploads = [dict(r, path=r["key"][rel:]) for r in uploads.aborted + aborted]


def _proven_checksums(states: list[ObjectState], inv: LocalInventory) -> dict[str, str]:
    """The server checksums HEAD reported that are those of the local bytes (whole-object, or the
    composite of the per-part digests taken when hashing); an object with none, or with one not shown to
    be of these bytes, is left out (proving it later takes reading its bytes)."""
    out = {}
    for state in states:
        entry = next(e for e in inv.files if e.path == state.path)
        digest = _digest_of(entry, inv.digests)
        if state.checksum is not None and state.checksum in server_checksums_of(digest):
            out[state.path] = state.checksum
    return out


def delete_verified_payloads(
    artifact_dir: Path,
    manifest: manifest_record.Manifest,
    store: ObjectStore,
    progress: bool | None = None,
) -> tuple[list[str], int, list[dict]]:
    """Remove the manifest's payload files once the receipt on disk proves the live remote copy
    (``release.prove_release``: the same checks as prune-verified; objects without a recorded server
    checksum are read back and hashed). The manifest, the receipt and every record stay. Raises
    (deleting nothing) if any check fails; a file replaced after its check is kept. Returns the removed
    paths, the bytes the file system got back, and the removed files still held under another name (a
    hard link: unlinked from the artifact, nothing freed), as prune-verified reports them."""
    from .release import prove_release, unlink_checked

    receipt = receipt_record.read_receipt(artifact_dir)
    checked = prove_release(artifact_dir, store, receipt, manifest, read=READ_UNPROVEN, progress=progress)
    released = unlink_checked(artifact_dir, checked)
    for reason in released.kept:
        log.warning("%s: %s", artifact_dir, reason)
    return released.removed, released.freed_bytes, released.held
