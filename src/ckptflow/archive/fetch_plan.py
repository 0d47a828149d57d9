"""The fetch plan: what an archived artifact's remote declaration and manifest say to stage, validated.

``read_plan`` reads the declaration ``.posttrain-archive.json`` and the manifest under a prefix, checks
them against each other (or, for a legacy archive without a declaration, against the objects' HEADs) and
returns a ``FetchPlan``: the declared files per component, the records that are no component, and the
scope (the components) a fetch stages, and the part digests the declaration binds (``part_digests``;
none, with a warning naming the record, when the record is missing or damaged: ``part_digests.usable_part_digests``). ``require_remote`` HEADs the objects still to download. Nothing
local is read or written here: fetch (``fetch.py``) and restore decide and write from the plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import PurePosixPath

from ..digest import PartDigests, sha256_bytes
from ..errors import InvalidRecord, NotFound, Refused, UnsafePath, VerificationFailed
from ..records import declaration as declaration_record
from ..records import manifest as manifest_record
from ..records import staging as staging_record
from ..records.inventory import FileEntry, sorted_entries
from ..store import StoreURI
from ..store.base import ObjectStore
from . import stage
from .keys import object_key
from .part_digests import FILENAME as PART_DIGESTS_FILENAME
from .part_digests import usable_part_digests
from .verify import check_remote_inventory


@dataclass(frozen=True)
class FetchPlan:
    """What the remote records say to fetch, validated; nothing local was looked at yet.

    ``parts`` holds every component's declared files; ``components`` is the scope this plan stages (None:
    the whole artifact), and ``payloads``/``inventory`` are that scope's files."""

    source: StoreURI
    prefix: str
    iteration: int
    manifest_bytes: bytes
    declaration_sha256: str | None  # None: a legacy archive without a declaration
    parts: Mapping[str, tuple[FileEntry, ...]]  # component name -> its files, as declared
    records: tuple[str, ...]  # declared files that are no component (merge record, diagnostic)
    components: tuple[str, ...] | None = None
    # path -> declared part digests, checked range by range as the file downloads (empty: none declared)
    part_digests: Mapping[str, PartDigests] = field(default_factory=dict, compare=False, repr=False)

    @property
    def payloads(self) -> tuple[FileEntry, ...]:
        return self.payloads_of(self.components)

    @property
    def inventory(self) -> tuple[FileEntry, ...]:
        """Every file the staged copy holds: the scope's payloads and the manifest, sorted by path."""
        return self.inventory_of(self.components)

    @property
    def not_fetched(self) -> tuple[str, ...]:
        """Declared files this plan leaves in the archive: records, and the components outside its scope."""
        chosen = {e.path for e in self.payloads}
        return tuple(sorted([*self.records, *(e.path for es in self.parts.values() for e in es if e.path not in chosen)]))

    def payloads_of(self, components: Iterable[str] | None) -> tuple[FileEntry, ...]:
        names = self.parts if components is None else components
        return sorted_entries(e for name in names for e in self.parts[name])

    def inventory_of(self, components: Iterable[str] | None) -> tuple[FileEntry, ...] | None:
        """The files a copy of ``components`` (None: all) holds; None when one is not a component here."""
        if components is not None and not set(components) <= set(self.parts):
            return None
        manifest = FileEntry(manifest_record.FILENAME, len(self.manifest_bytes), sha256_bytes(self.manifest_bytes))
        return sorted_entries((*self.payloads_of(components), manifest))

    def scoped(self, components: Iterable[str] | None) -> FetchPlan:
        """This plan staging ``components`` (None or every component: the whole artifact)."""
        scope = None if components is None or set(components) >= set(self.parts) else tuple(sorted(set(components)))
        return replace(self, components=scope)

    def where(self, rel: str) -> str:
        return str(self.source.child(rel)) if self.source.scheme != "file" else f"{self.source}/{rel}"


def _get_record(store: ObjectStore, prefix: str, filename: str) -> bytes | None:
    try:
        return store.get_bytes(object_key(prefix, filename))
    except NotFound:
        return None


def read_plan(store: ObjectStore, prefix: str, source: StoreURI, *, iteration: int | None = None,
              components: Iterable[str] | None = None) -> FetchPlan:
    """Read and validate the declaration and the manifest under ``prefix``; decide what to fetch.

    ``components`` (None: all) is the scope: a name the manifest does not have is refused. The whole
    declaration and manifest are checked whatever the scope (a legacy archive's objects are all HEAD-checked,
    as the digests of every component come from there)."""
    decl_bytes = _get_record(store, prefix, declaration_record.FILENAME)
    declaration = None
    if decl_bytes is not None:
        declaration = declaration_record.parse_declaration(
            decl_bytes, what=f"{declaration_record.FILENAME} at {source}")
    manifest_bytes = _get_record(store, prefix, manifest_record.FILENAME)
    if manifest_bytes is None:
        if declaration is None:
            raise NotFound(f"no artifact at {source}: neither {manifest_record.FILENAME} nor "
                           f"{declaration_record.FILENAME} exists there",
                           remedy="check --artifact-uri (…/checkpoint_artifacts/iter_N) and the endpoint in the credentials")
        raise NotFound(f"{source} has a declaration but no {manifest_record.FILENAME}: its publication did not finish",
                       remedy="rerun `ckptflow publish` for this artifact from its local copy, then fetch again")
    manifest = manifest_record.parse_manifest(manifest_bytes, what=f"{manifest_record.FILENAME} at {source}")
    if iteration is not None and manifest.iteration != iteration:
        raise InvalidRecord(f"{manifest_record.FILENAME} at {source} records iteration {manifest.iteration}, "
                            f"not the {iteration} of its prefix", remedy="the archive is misplaced or corrupt; check the URI")
    if components is not None:
        components = sorted(set(components))
        unknown = [c for c in components if c not in manifest.components]
        if not components or unknown:
            raise Refused(f"the manifest at {source} has no component {unknown[0] if unknown else '(none named)'!r} "
                          f"(its components: {', '.join(sorted(manifest.components))})",
                          remedy="name one of its components, or fetch the whole artifact")
    if declaration is not None:
        payloads, records = _declared_payloads(declaration, manifest, manifest_bytes, source)
        decl_sha = sha256_bytes(decl_bytes)
        part_digests = usable_part_digests(store, prefix, declaration.files)
    else:
        payloads, records, decl_sha = _legacy_payloads(store, prefix, manifest, source), (), None
        part_digests = {}
    for entry in payloads:
        name = PurePosixPath(entry.path).name
        if entry.path == staging_record.FILENAME or stage.is_part_name(name):
            raise UnsafePath(f"{manifest_record.FILENAME} at {source} names the file {entry.path!r}, which "
                             "collides with fetch's own record or temporaries", remedy="the archive is corrupt or hostile")
    parts = {name: sorted_entries(e for e in payloads if _in_component(e.path, comp.path))
             for name, comp in manifest.components.items()}
    plan = FetchPlan(source, prefix, manifest.iteration, manifest_bytes, decl_sha, parts, tuple(records),
                     part_digests=part_digests)
    return plan.scoped(components)


def _in_component(path: str, component_path: str) -> bool:
    return path == component_path or path.startswith(component_path + "/")


def _declared_payloads(declaration, manifest, manifest_bytes: bytes, source: StoreURI):
    what = f"{declaration_record.FILENAME} at {source}"
    got = sha256_bytes(manifest_bytes)
    if got != declaration.manifest_sha256:
        raise VerificationFailed(f"{manifest_record.FILENAME} at {source} hashes to {got}, but {what} binds "
                                 f"{declaration.manifest_sha256}", remedy="the archive is damaged; republish it from a local copy")
    if declaration.iteration != manifest.iteration:
        raise InvalidRecord(f"{what} is for iteration {declaration.iteration}, the manifest for {manifest.iteration}",
                            remedy="the archive is damaged; republish it from a local copy")
    declared = {e.path: e for e in declaration.files}
    payloads = []
    for entry in manifest.physical_files():
        listed = declared.get(entry.path)
        if listed is None:
            raise InvalidRecord(f"{what} does not list {entry.path}, a file of the manifest's components",
                                remedy="the archive is damaged; republish it from a local copy")
        if listed.size != entry.size or (entry.sha256 is not None and listed.sha256 != entry.sha256):
            raise InvalidRecord(f"{what} lists {entry.path} as {listed.size} bytes sha256 {listed.sha256}, the manifest as "
                                f"{entry.size} bytes sha256 {entry.sha256}", remedy="the archive is damaged; republish it")
        payloads.append(listed)
    chosen = {e.path for e in payloads} | {manifest_record.FILENAME, PART_DIGESTS_FILENAME}  # the fetch reads those
    return payloads, sorted(p for p in declared if p not in chosen)


def _legacy_payloads(store: ObjectStore, prefix: str, manifest, source: StoreURI) -> list[FileEntry]:
    dcp = sorted(n for n, c in manifest.components.items() if isinstance(c, manifest_record.DcpComponent))
    if dcp:
        raise Refused(f"{source} has no {declaration_record.FILENAME} and component {dcp[0]!r} is a DCP directory: "
                      "a listing cannot prove that every shard is present",
                      remedy="republish the artifact from its local copy with `ckptflow publish` (it writes a declaration)")
    payloads = []
    for entry in manifest.physical_files():
        info = store.head(object_key(prefix, entry.path))
        where = f"{source}/{entry.path}"
        if info is None:
            raise NotFound(f"{where} is listed by the manifest but missing from the store",
                           remedy="the archive is incomplete; restore the object or republish the artifact")
        if info.size != entry.size:
            raise VerificationFailed(f"{where} has {info.size} bytes, the manifest says {entry.size}",
                                     remedy="the archive is damaged; republish the artifact")
        if entry.sha256 and info.sha256 and entry.sha256 != info.sha256:
            raise VerificationFailed(f"{where}: the manifest's sha256 {entry.sha256} contradicts the object's "
                                     f"metadata {info.sha256}", remedy="the archive is damaged; republish the artifact")
        digest = entry.sha256 or info.sha256
        if digest is None:
            raise Refused(f"{where} has no digest in the manifest nor in the object's metadata, and {source} has no "
                          f"{declaration_record.FILENAME}: its bytes cannot be verified",
                          remedy="republish the artifact from its local copy with `ckptflow publish`")
        payloads.append(FileEntry(entry.path, entry.size, digest))
    return payloads


def require_remote(store: ObjectStore, plan: FetchPlan, todo: list[FileEntry]) -> None:
    """HEAD every object still to download: missing or contradicting ones fail now, by name."""
    for state in check_remote_inventory(store, plan.prefix, todo):
        if state.state == "missing":
            raise NotFound(f"{plan.where(state.path)} is declared by the archive but missing from the store",
                           remedy="the archive is incomplete (not a smaller artifact); restore the object or republish "
                           "the artifact from its local copy")
        if state.state == "changed":
            raise VerificationFailed(f"{plan.where(state.path)} does not match the archive's declaration ({state.detail})",
                                     remedy="the archived object was replaced or damaged; restore it or republish")
