"""The local side of publication (steps 1–2 of ``publish.py``): the files selected, hashed once, checked
against the manifest, and the declaration built from them (``build_local_inventory`` → ``LocalInventory``).

Selected: the manifest's physical components (every DCP shard), the merge completion record, a preserved
legacy manifest, and the diagnostic the merge record names if it lies inside the artifact. A payload that
contradicts the manifest is refused before anything remote happens; missing ``file`` component digests
are added to the local manifest (atomically; in memory only for a dry run). A payload pruned since an
earlier publication is declared from the manifest's digest. The same pass takes every file's BLAKE3
part digests; their record (``records/part_digests.py``) is declared like an archived file, so the
declaration binds it (a pruned payload keeps the parts the artifact's own copy of that record holds).
Nothing here reads or writes the store.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..artifact import iteration_from_dir, refuse_unrestorable_names
from ..digest import FileDigest, PartDigests, hash_files, part_digest_size, sha256_bytes
from ..errors import CkptflowError, NotFound, Refused, UnsafePath
from ..fsutil import resolve_inside
from ..records import LegacyRecord, merge_record
from ..records import declaration as declaration_record
from ..records import legacy_manifest as legacy_record
from ..records import manifest as manifest_record
from ..records import part_digests as part_digests_record
from ..records.inventory import FileEntry

log = logging.getLogger(__name__)


def _selected_paths(artifact_dir: Path, manifest: manifest_record.Manifest) -> tuple[list[str], list[FileEntry]]:
    """The selected files on disk, and the manifest's payload files that are gone (pruned) but whose
    size and digest the manifest records. Any other missing file is refused."""
    pruned = [e for e in manifest.physical_files()
              if e.sha256 is not None and not os.path.lexists(artifact_dir / e.path)]
    gone = {e.path for e in pruned}
    paths = [e.path for e in manifest.physical_files() if e.path not in gone]
    if merge_record.path_in(artifact_dir).exists():
        paths.append(merge_record.FILENAME)
        diag = merge_record.read_merge_record(artifact_dir).diag
        if diag is not None and (artifact_dir / diag).is_file():
            paths.append(diag)
    if legacy_record.path_in(artifact_dir).exists():
        paths.append(legacy_record.FILENAME)
    for rel in paths:
        target = resolve_inside(artifact_dir, rel, what=f"artifact file {rel}")
        if not target.exists():
            raise NotFound(
                f"{target} is listed by the manifest but missing",
                remedy="the artifact is incomplete; restore the file or re-save the artifact",
            )
        if not target.is_file():
            raise UnsafePath(f"{target} is not a regular file", remedy="artifacts hold regular files only")
    return sorted(set(paths)), pruned


def _check_against_manifest(
    artifact_dir: Path, manifest: manifest_record.Manifest, digests: dict[str, FileDigest], write: bool = True,
) -> manifest_record.Manifest:
    """Refuse payloads that contradict the manifest; return it with missing file digests filled in
    (written to the local manifest unless ``write`` is False: a dry run)."""
    for entry in manifest.physical_files():
        got = digests.get(entry.path)
        if got is None:  # pruned: the manifest's own digest stands for it
            continue
        if got.size != entry.size or (entry.sha256 is not None and got.sha256 != entry.sha256):
            raise Refused(
                f"{artifact_dir / entry.path} contradicts {manifest_record.FILENAME}: found size {got.size} "
                f"sha256 {got.sha256}, manifest says size {entry.size} sha256 {entry.sha256}",
                remedy="the payload changed after the manifest was committed; nothing was uploaded — "
                "restore the original bytes or save a new artifact",
            )
    components = dict(manifest.components)
    changed = False
    for name, comp in components.items():
        if isinstance(comp, manifest_record.FileComponent) and comp.sha256 is None:
            components[name] = manifest_record.FileComponent(comp.path, comp.size, digests[comp.path].sha256)
            changed = True
    if not changed:
        return manifest
    filled = manifest_record.Manifest(iteration=manifest.iteration, components=components, producer=manifest.producer)
    if not write:
        return filled
    manifest_record.write_manifest(artifact_dir, filled)
    log.info("added missing component digests to %s", manifest_record.path_in(artifact_dir))
    return filled


def _read_native_manifest(artifact_dir: Path) -> manifest_record.Manifest:
    path = manifest_record.path_in(artifact_dir)
    if not path.exists():
        raise NotFound(
            f"{path} does not exist: the artifact is not committed (an interrupted save?)",
            remedy="only committed artifacts are published; seal it with `ckptflow seal` if its files are complete",
        )
    try:
        return manifest_record.read_manifest(artifact_dir)
    except LegacyRecord:
        from .legacy import convert_legacy_manifest

        return convert_legacy_manifest(artifact_dir)


@dataclass(frozen=True)
class LocalInventory:
    manifest: manifest_record.Manifest
    manifest_bytes: bytes
    declaration: declaration_record.Declaration
    declaration_bytes: bytes
    # The payload digests of the hashing pass, with per-part digests where the store asked for them.
    digests: dict[str, FileDigest] = field(default_factory=dict, compare=False, repr=False)
    # Payload files gone locally (pruned after an earlier publication), declared from the manifest's digests.
    pruned: tuple[str, ...] = ()
    # The encoded part digests record, declared among the files; None: an archive without one.
    part_digests_bytes: bytes | None = None

    @property
    def files(self) -> tuple[FileEntry, ...]:
        return self.declaration.files

    def with_pruned_parts(self, known: Mapping[str, PartDigests]) -> LocalInventory:
        """This inventory with the part digests of its pruned payloads taken from ``known`` (the record an
        archive holds, checked against its declaration) where it has none for them: the declaration an
        earlier publication wrote when the artifact's own record is gone."""
        entries = {e.path: e for e in self.declaration.files}
        pruned = [entries[p] for p in self.pruned]
        record = _with_known_parts(part_digests_record.from_digests(self.digests), pruned, known)
        return _declare(self.manifest, self.manifest_bytes, self.digests, pruned, record)

    def without_part_digests(self) -> LocalInventory:
        """This inventory as a publication before part digests declared it: the same files, no part
        digests record (the form of an archive published so, kept when it is published again)."""
        if self.part_digests_bytes is None:
            return self
        files = tuple(e for e in self.declaration.files if e.path != part_digests_record.FILENAME)
        declaration = declaration_record.Declaration(self.declaration.manifest_sha256, self.declaration.iteration, files)
        return LocalInventory(self.manifest, self.manifest_bytes, declaration,
                              declaration_record.encode_declaration(declaration), self.digests, self.pruned, None)


def _with_known_parts(record, pruned: list[FileEntry], known: Mapping[str, PartDigests]):
    """``record`` (None: empty) with the parts ``known`` holds for ``pruned`` payloads of the same size and
    sha256 (never replacing one it has); None when it ends up empty."""
    files = dict(record.files) if record is not None else {}
    for entry in pruned:
        parts = known.get(entry.path)
        if entry.path not in files and parts is not None and (parts.size, parts.sha256) == (entry.size, entry.sha256):
            files[entry.path] = parts
    return part_digests_record.PartDigestRecord(tuple(files.items())) if files else None


def _part_digests(artifact_dir: Path, digests: dict[str, FileDigest], pruned: list[FileEntry]):
    """The part digests record of this pass: every hashed file's, and those of pruned payloads as the
    artifact's own record holds them (when it does, for the same size and sha256); None when no file has
    any. An unreadable own record only loses the pruned files' parts (they are then verified by SHA-256)."""
    record = part_digests_record.from_digests(digests)
    own: dict[str, PartDigests] = {}
    if pruned and part_digests_record.path_in(artifact_dir).is_file():
        try:
            own = part_digests_record.read_part_digests(artifact_dir).by_path()
        except (CkptflowError, OSError) as exc:
            log.warning("%s: the parts of its pruned payloads are not known: %s", artifact_dir, exc)
    return _with_known_parts(record, pruned, own)


def build_local_inventory(artifact_dir: Path, *, progress: bool | None = None,
                          part_size_for: Callable[[int], int | None] | None = None,
                          md5_parts_for: Callable[[str, int], int | None] | None = None,
                          write: bool = True) -> LocalInventory:
    """Steps 1–2: select, hash once, check against the manifest, and build the declaration.

    ``part_size_for`` is the store's ``part_digest_size``: the same pass also takes the per-part digests
    that let the server refuse any part whose bytes differ from those hashed here. ``md5_parts_for(path,
    size)`` names the files (and part size) whose per-part MD5s the pass also takes, to prove the parts
    of an unfinished upload a killed run left. ``write`` False (a dry run): nothing local is written."""
    manifest = _read_native_manifest(artifact_dir)
    if iteration_from_dir(artifact_dir) != manifest.iteration:
        raise Refused(
            f"{manifest_record.path_in(artifact_dir)} records iteration {manifest.iteration}, "
            f"but the directory is {artifact_dir.name}",
            remedy="publish the directory the manifest belongs to",
        )
    refuse_unrestorable_names(artifact_dir, [e.path for e in manifest.physical_files()])
    selected, pruned = _selected_paths(artifact_dir, manifest)
    digests = hash_files(artifact_dir, selected, progress=progress, desc="publish sha256", part_size_for=part_size_for,
                         md5_parts_for=md5_parts_for, blake3_parts_for=part_digest_size)
    checked = _check_against_manifest(artifact_dir, manifest, digests, write)
    manifest_bytes = (manifest_record.path_in(artifact_dir).read_bytes() if write or checked is manifest
                      else manifest_record.encode_manifest(checked))
    return _declare(checked, manifest_bytes, digests, pruned, _part_digests(artifact_dir, digests, pruned))


def _declare(manifest: manifest_record.Manifest, manifest_bytes: bytes, digests: dict[str, FileDigest],
             pruned: list[FileEntry], parts) -> LocalInventory:
    """The declaration of the hashed files, the pruned payloads, the manifest and the part digests record
    ``parts`` (None: none), which must agree with it."""
    manifest_sha = sha256_bytes(manifest_bytes)
    entries = [FileEntry(p, d.size, d.sha256) for p, d in digests.items()] + pruned
    entries.append(FileEntry(manifest_record.FILENAME, len(manifest_bytes), manifest_sha))
    parts_bytes = None
    if parts is not None:
        parts.check_bound(entries, part_digests_record.FILENAME)  # a record that disagrees is never written
        parts_bytes = part_digests_record.encode_part_digests(parts)
        entries.append(FileEntry(part_digests_record.FILENAME, len(parts_bytes), sha256_bytes(parts_bytes)))
    declaration = declaration_record.Declaration(
        manifest_sha256=manifest_sha, iteration=manifest.iteration, files=tuple(entries)
    )
    return LocalInventory(manifest, manifest_bytes, declaration, declaration_record.encode_declaration(declaration),
                          digests, tuple(e.path for e in pruned), parts_bytes)
