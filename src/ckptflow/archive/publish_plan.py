"""``plan_publication``: what ``publish_artifact`` would do, decided by the same checks, writing nothing.

``ckptflow publish --dry-run`` runs it. The artifact is hashed (a digest the manifest lacks is filled in
memory only), the destination derived or checked exactly as the real run does it (``keys.upload_prefix_for``),
and the store only read: HEAD and GET of the archive's records and payloads, never a PUT, a multipart
upload, a probe object, a cache entry or a file beside the artifact. The report names the destination URI
of every file with what the real run would do with it: ``send`` (absent or different there), ``stored``
(already there with these bytes), ``adopt`` (the committed archive there is this artifact's, or an object
another tool left under a prefix without a declaration holds it, by its sha256 metadata or by its bytes
read: the real run then adds the metadata in place, ``store.adopt_object``) or ``skip`` (the
receipt already matches). Objects under a prefix without a declaration are judged as the real run judges
them (``adopt.judge_undeclared``): a foreign one is refused by key here too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..digest import sha256_bytes
from ..errors import Refused, UsageError
from ..records import declaration as declaration_record
from ..records import manifest as manifest_record
from ..store.base import ObjectStore
from .adopt import adopt_pruned, declared_form, judge_undeclared
from .keys import object_key
from .publish import check_destination, receipt_matches
from .publish_inventory import build_local_inventory
from .verify import check_remote_inventory


def _uri(store: ObjectStore, key: str) -> str:
    return str(store.destination.uri(key))


def _refuse_legacy(artifact_dir: Path) -> None:
    """A legacy manifest is converted (written) by the real run: a dry run cannot plan it without writing."""
    from ..records import LegacyRecord

    try:
        manifest_record.read_manifest(artifact_dir)
    except LegacyRecord:
        raise UsageError(
            f"{manifest_record.path_in(artifact_dir)} is a legacy manifest: publishing converts it in place first, "
            "so a dry run cannot plan it without writing", remedy="publish it without --dry-run") from None
    except (OSError, ValueError):
        return  # the inventory step reports it by name


def _matches_remote(store: ObjectStore, prefix: str, name: str, expected: bytes) -> bool | None:
    """None: no such object; else whether it holds ``expected`` byte for byte."""
    key = object_key(prefix, name)
    if store.head(key) is None:
        return None
    found = store.get_bytes(key)
    if found != expected:
        raise Refused(f"{_uri(store, key)} (sha256 {sha256_bytes(found)}) is not this artifact's {name} "
                      f"(sha256 {sha256_bytes(expected)}): the real run would be refused there",
                      remedy="archives are create-once; publish this artifact to another destination")
    return True


def plan_publication(artifact_dir: Path | str, store: ObjectStore, upload_prefix: str | None, *,
                     delete_local: bool = False, add_destination: bool = False) -> dict[str, Any]:
    """The dry-run report (schema ``report_publish``, status ``dry-run``); raises what the real run would
    raise before its first write."""
    artifact_dir = Path(artifact_dir)
    prefix, dest, earlier = check_destination(artifact_dir, store, upload_prefix, add_destination)
    _refuse_legacy(artifact_dir)
    inv = declared_form(store, prefix, artifact_dir, build_local_inventory(artifact_dir, progress=False, write=False))
    decl_sha = sha256_bytes(inv.declaration_bytes)
    records = {declaration_record.FILENAME: inv.declaration_bytes, manifest_record.FILENAME: inv.manifest_bytes}

    actions: dict[str, str] = {}
    adopted: list[dict] = []
    if receipt_matches(artifact_dir, dest, decl_sha, inv):
        would = "skipped"
        actions = {e.path: "skip" for e in inv.files}
    elif inv.pruned:
        adopt_pruned(store, prefix, artifact_dir, inv)  # reads only: refuses unless the archive is this one
        would = "adopted"
    elif store.head(object_key(prefix, manifest_record.FILENAME)) is not None:
        for name, expected in records.items():
            _matches_remote(store, prefix, name, expected)
        would = "adopted"
    else:
        would = "published"
        adopted = judge_undeclared(store, prefix, inv)
        by_metadata = {row["path"] for row in adopted if row["proof"] == "sha256 metadata"}
        by_read = {row["path"] for row in adopted if row["proof"] == "read"}
        payloads = [e for e in inv.files if e.path != manifest_record.FILENAME]
        for entry, state in zip(payloads, check_remote_inventory(store, prefix, payloads), strict=True):
            if entry.path in by_read:  # the real run gives it its metadata in place, up to the store's limit
                actions[entry.path] = "adopt" if entry.size <= store.adopts_objects_up_to else "send"
            else:
                actions[entry.path] = ("adopt" if entry.path in by_metadata else "stored") if state.state == "ok" else "send"
        actions[manifest_record.FILENAME] = "send"
    files = [{"path": e.path, "uri": _uri(store, object_key(prefix, e.path)), "size": e.size,
              "action": actions.get(e.path, "adopt")} for e in inv.files]
    decl_state = {"skipped": "skip", "adopted": "adopt"}.get(would) or (
        "stored" if _matches_remote(store, prefix, declaration_record.FILENAME, inv.declaration_bytes) else "send")
    files.append({"path": declaration_record.FILENAME,
                  "uri": _uri(store, object_key(prefix, declaration_record.FILENAME)),
                  "size": len(inv.declaration_bytes), "action": decl_state})
    report: dict[str, Any] = {
        "status": "dry-run", "would": would, "artifact_dir": str(artifact_dir), "destination": dest.to_dict(),
        "declaration_sha256": decl_sha, "inventory": [e.to_dict() for e in inv.files],
        "files": files, "bytes_to_send": sum(f["size"] for f in files if f["action"] == "send"),
        "uploaded": [], "uploaded_bytes": 0, "removed": [], "freed_bytes": 0,
    }
    if delete_local:
        report["would_remove"] = sorted(e.path for e in inv.manifest.physical_files() if e.path not in inv.pruned)
    if earlier:
        report["earlier_destinations"] = [d.to_dict() for d in earlier]
    if adopted:
        report["adopted_objects"] = adopted
    return report
