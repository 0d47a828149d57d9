"""What a destination already holds of an artifact, adopted rather than written again: the objects under a
prefix without a declaration (``judge_undeclared``: this artifact's bytes are adopted, anything else refuses
the publication by key), the committed archive of an artifact pruned here (``adopt_pruned``), and the form
of the declaration an archive made before part digests existed keeps (``declared_form``).

``publish_artifact`` and its dry run (``publish_plan``) call these before their first write; they read the
store only, except ``adopt_read_objects``, which gives an adopted object its ``sha256`` metadata in place.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..digest import FileDigest, sha256_bytes
from ..errors import CkptflowError, NotFound, Refused
from ..records import declaration as declaration_record
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from ..records.inventory import FileEntry
from ..store.base import ObjectStore
from .keys import object_key
from .part_digests import load_part_digests
from .publish_inventory import LocalInventory
from .verify import read_back

log = logging.getLogger(__name__)


def judge_undeclared(store: ObjectStore, prefix: str, inv: LocalInventory) -> list[dict]:
    """Before the first write under a prefix that holds no declaration: judge every object already there
    (reads only). One with a declared file's size and SHA-256, by its ``sha256`` metadata or, without
    metadata, by its bytes read and hashed, is adopted (``{"path", "proof"}``, sorted by path); any other
    object (other bytes, or no file of this artifact) refuses the publication by key, since a payload write
    would replace it. A declared prefix returns ``[]``: its objects were written under that declaration."""
    return judge_undeclared_objects(store, prefix, inv)[0]


def judge_undeclared_objects(store: ObjectStore, prefix: str, inv: LocalInventory) -> tuple[list[dict], dict[str, str | None]]:
    """``judge_undeclared``'s rows, and the ETag (None where the store has none) of each object adopted by
    its bytes read, so that ``adopt_read_objects`` gives its metadata to that very object."""
    from .probe import PROBE_DIR

    declaration_key = object_key(prefix, declaration_record.FILENAME)
    if store.head(declaration_key) is not None:
        return [], {}
    declared = {object_key(prefix, e.path): e for e in inv.files}
    scratch = object_key(prefix, PROBE_DIR) + "/"  # a probe's own scratch objects (it removes them)
    foreign: list[str] = []
    adopted: list[dict] = []
    to_read: list[FileEntry] = []
    etags: dict[str, str | None] = {}
    for listed in store.list(prefix + "/"):
        if listed.key == declaration_key or listed.key.startswith(scratch):
            continue
        uri = store.destination.uri(listed.key)
        entry = declared.get(listed.key)
        if entry is None:
            foreign.append(f"{uri} (not a file of this artifact)")
            continue
        info = store.head(listed.key)
        if info is None:
            continue  # gone since the listing
        if info.size != entry.size:
            foreign.append(f"{uri} ({info.size} bytes, not the {entry.size} of {entry.path})")
        elif info.sha256 is None:
            to_read.append(entry)
            etags[entry.path] = info.etag
        elif info.sha256 != entry.sha256 or info.checksum_sha256 not in (None, entry.sha256):
            foreign.append(f"{uri} (sha256 {info.sha256 if info.sha256 != entry.sha256 else info.checksum_sha256}, "
                           f"not the {entry.sha256} of {entry.path})")
        else:
            adopted.append({"path": entry.path, "proof": "sha256 metadata"})
    for state in read_back(store, prefix, to_read):
        if state.state == "ok":
            adopted.append({"path": state.path, "proof": "read"})
        elif state.state != "missing":
            foreign.append(f"{store.destination.uri(state.key)} ({state.detail})")
    if foreign:
        more = f" (+{len(foreign) - 5} more)" if len(foreign) > 5 else ""
        raise Refused(
            f"{store.destination.uri(prefix)} holds no declaration, and {len(foreign)} object(s) there are not this "
            f"artifact's: {'; '.join(foreign[:5])}{more}; publishing would replace them, so nothing was written",
            remedy="publish this artifact to another destination, or move those objects away first if they are "
            "not needed (ckptflow never replaces an object it did not write)")
    for row in adopted:
        log.info("%s: adopting %s already there with its bytes (%s)", store.destination.uri(prefix), row["path"],
                 row["proof"])
    read = {row["path"] for row in adopted if row["proof"] == "read"}
    return sorted(adopted, key=lambda row: row["path"]), {path: etags[path] for path in read}


def adopt_read_objects(store: ObjectStore, prefix: str, inv: LocalInventory, etags: dict[str, str | None]) -> None:
    """Once the declaration claims the prefix: give each object adopted by its bytes read the ``sha256``
    metadata HEAD checks, without sending or changing its bytes (``store.adopt_object``); one the store
    cannot adopt so (replaced since it was read, too large for a server-side copy) is left for the
    payload upload, which sends the file."""
    for entry in inv.files:
        if entry.path not in etags or entry.size > store.adopts_objects_up_to:
            continue
        info = store.adopt_object(object_key(prefix, entry.path), FileDigest(entry.size, entry.sha256),
                                  etag=etags[entry.path])
        if info is None:
            log.info("%s: %s could not be adopted in place; sending it", store.destination.uri(prefix), entry.path)


def adopt_pruned(store: ObjectStore, prefix: str, artifact_dir: Path, inv: LocalInventory) -> None:
    """Adopt the committed archive of an artifact whose payloads were pruned here; write nothing remote.

    The missing files cannot be uploaded, so the destination must already hold this very artifact: a
    declaration and a manifest byte-identical to the ones built from the local manifest and records."""
    where = str(store.destination.uri(prefix))
    missing = f"{len(inv.pruned)} payload file(s) ({artifact_dir / inv.pruned[0]}{', ...' if len(inv.pruned) > 1 else ''})"
    for name, expected in ((declaration_record.FILENAME, inv.declaration_bytes), (manifest_record.FILENAME, inv.manifest_bytes)):
        key = object_key(prefix, name)
        if store.head(key) is None:
            raise NotFound(
                f"{missing} listed by the manifest are gone locally (pruned?), and {where} holds no {name} "
                "of a committed archive to adopt",
                remedy="publish to the destination that holds this artifact's archive (the one its receipt named), "
                "or bring the files back with `ckptflow fetch` first",
            )
        found = store.get_bytes(key)
        if found != expected:
            raise Refused(
                f"{where}/{name} (sha256 {sha256_bytes(found)}) is not this artifact's (sha256 {sha256_bytes(expected)}), "
                f"and {missing} listed by the manifest are gone locally, so nothing can be published there",
                remedy="publish to the destination that holds this artifact's archive (the one its receipt named)",
            )
    log.info("%s: payloads pruned locally; adopting the identical committed archive at %s", artifact_dir, where)


def declared_form(store: ObjectStore, prefix: str, artifact_dir: Path, inv: LocalInventory) -> LocalInventory:
    """``inv``, or ``inv`` without its part digests when the artifact was archived before they existed:
    its receipt binds that declaration (every destination of a receipt holds the same one), or the
    declaration already at ``prefix`` is that one; or, for payloads pruned here whose parts the artifact's
    own record no longer holds, ``inv`` with the parts the archive's record holds. Reads only (the
    receipt, one GET, and the archive's record in that last case)."""
    if inv.part_digests_bytes is None and not inv.pruned:
        return inv
    plain = inv.without_part_digests()
    receipt = receipt_record.belonging_receipt(artifact_dir)
    if receipt is not None:
        if receipt.declaration_sha256 == sha256_bytes(inv.declaration_bytes):
            return inv
        if receipt.declaration_sha256 == sha256_bytes(plain.declaration_bytes):
            return plain
    try:
        existing = store.get_bytes(object_key(prefix, declaration_record.FILENAME))
    except NotFound:
        return inv
    if existing == plain.declaration_bytes:
        return plain
    if inv.pruned and existing != inv.declaration_bytes:
        # Payloads pruned here and the artifact's own record gone: the archive's record (bound by its
        # declaration) holds their parts. Taken only if the declaration then comes out byte for byte.
        try:
            remote = declaration_record.parse_declaration(existing)
            rebuilt = inv.with_pruned_parts(load_part_digests(store, prefix, remote.files))
        except CkptflowError as exc:
            log.info("%s: the archive's part digests cannot stand in for the pruned payloads: %s", artifact_dir, exc)
            return inv
        if rebuilt.declaration_bytes == existing:
            return rebuilt
    return inv
