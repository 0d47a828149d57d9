"""Where ``materialize`` takes model.pt from, and the source identity of record, read without payloads.

* ``--ckpt-dir DIR``: a local artifact (trainer or merge output). Its native manifest must have a ``model``
  component of format ``file``. The identity is that descriptor (size + sha256); the local file's size is
  checked at once. Under the output's lock the file is opened ONCE (``OpenedModel``): its digest is taken
  from that descriptor before a build (``bind``/``check_digest``), so a skip never reads it, and the
  conversion and the verification read the same descriptor (``read_path``): a ``model.pt`` replaced at
  its path while the request waited or converted is never what the marker names. A manifest without a
  digest (trainers may not hash) makes the opened file be hashed for the identity itself.
* ``--artifact-uri URI``: an archived artifact (``s3://``, ``gs://``, ``file://`` ending in ``iter_N``). Only
  the remote native manifest is read (one small GET); a manifest without a digest for the model falls
  back to the object's ``sha256`` metadata (HEAD), as fetch does for legacy archives. The payload is
  fetched by ``archive.fetch.fetch_artifact`` only when a build needs it, and only the ``model`` component.
* A local source whose model.pt is gone (pruned after its publication), or was removed while the request
  waited for the lock (resolved again under it, ``resolve_under_lock``), is read from an archive its receipt
  names when that archive holds the model the local manifest records: every destination the receipt lists
  is tried in its order (``archive.copies``), for the manifest here and again for the fetch of model.pt
  (``build.fetch_model``: a damaged copy at one goes on from the next), so the request converges without a
  rerun; the report's source location names the one that served, ``skipped_destinations`` the others.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..archive.copies import Skipped, Unusable, first_serving, open_copy
from ..archive.keys import parse_artifact_uri
from ..digest import FileDigest, sha256_file
from ..errors import CkptflowError, InvalidRecord, NotFound, Refused, VerificationFailed
from ..fsutil import resolve_inside
from ..progress import ByteProgress
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from ..records.materialized import SourceIdentity
from ..store import Credentials, StoreURI
from ..store.base import ObjectStore
from ..store.open import open_uri
from ..store.uri import destination_uri

MODEL_COMPONENT = "model"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReceiptCopies:
    """The copies a pruned artifact's receipt lists, for an archived source resolved through it: the one
    that serves now (``destination``), those skipped before it, and the credentials they are opened with
    (a ``Credentials``, or the raw ``--credentials`` value loaded per destination)."""

    artifact_dir: Path
    destination: receipt_record.ReceiptDestination
    skipped: tuple[Skipped, ...] = ()
    credentials: Any = None

    def remaining(self) -> list[receipt_record.ReceiptDestination]:
        """The receipt's destinations from the one serving now on, in its order."""
        dests = receipt_record.read_receipt(self.artifact_dir).destinations
        return list(dests[dests.index(self.destination):]) if self.destination in dests else list(dests)


@dataclass(frozen=True)
class ModelSource:
    kind: str  # "ckpt-dir" or "artifact-uri"
    location: str  # absolute artifact directory, or the artifact URI
    model_path: str  # the model component's path inside the artifact (model.pt)
    identity: SourceIdentity
    manifest_sha256: str | None  # the digest the manifest records (None: it records none)
    local_path: Path | None = None
    uri: StoreURI | None = None
    store: ObjectStore | None = None
    artifact_name: str = ""  # iter_N
    hashed: bool = False  # the local file was hashed for the identity itself (its manifest has no digest)
    copies: ReceiptCopies | None = None  # resolved through a pruned artifact's receipt (every copy it lists)

    def served_by(self, dest: receipt_record.ReceiptDestination, skipped: list[Skipped]) -> ModelSource:
        """This source as the receipt's destination ``dest`` serves it (same model: same declaration), after
        ``skipped`` more destinations could not."""
        assert self.copies is not None
        if dest == self.copies.destination and not skipped:
            return self
        uri = parse_artifact_uri(str(destination_uri(dest, dest.prefix))).uri  # as --artifact-uri parses it
        copies = replace(self.copies, destination=dest, skipped=(*self.copies.skipped, *skipped))
        return replace(self, location=str(uri), uri=uri, store=None, copies=copies,
                       identity=replace(self.identity, uri=str(uri)))

    @contextlib.contextmanager
    def open_local(self, *, progress: bool | None = None) -> Iterator[tuple[ModelSource, OpenedModel]]:
        """Open the local model.pt once (call under the output's lock). Yields the source bound to the
        opened file: a manifest without a digest gets its identity hashed from this descriptor."""
        assert self.local_path is not None
        opened = OpenedModel.open(self.local_path)
        try:
            if opened.size != self.identity.size:
                raise VerificationFailed(f"{self.local_path} has {opened.size} bytes; its manifest records "
                                         f"{self.identity.size}", path=str(self.local_path),
                                         remedy="the artifact was rewritten after its manifest; restore it")
            bound = self
            if self.hashed:
                digest = opened.digest(progress)
                bound = replace(self, identity=SourceIdentity(None, digest.sha256, digest.size))
            yield bound, opened
        finally:
            opened.close()

    def check_digest(self, opened: OpenedModel, *, progress: bool | None = None) -> None:
        """The opened model.pt's size and content hash against the identity (one read; none when the
        identity was itself hashed from this descriptor). For an archived source ``opened`` is the fetched
        copy: fetch verified it by path, this binds the digest to the descriptor the conversion reads."""
        if self.hashed:
            return
        digest = opened.digest(progress)
        if (digest.size, digest.sha256) == (self.identity.size, self.identity.sha256):
            return
        found = f"{opened.path} has {digest.size} bytes sha256 {digest.sha256}"
        if self.kind == "artifact-uri":
            raise VerificationFailed(
                f"{found} as this request opened it after the fetch; the archive at {self.location} records "
                f"{self.identity.size} bytes sha256 {self.identity.sha256}", path=str(opened.path),
                remedy="the staged copy was changed after the fetch verified it; leave the stage alone while "
                "materialize runs (or drop --stage-dir / --keep-staged for a private stage), then rerun")
        raise VerificationFailed(
            f"{found}; its manifest records {self.identity.size} bytes sha256 {self.identity.sha256}",
            path=str(opened.path),
            remedy="the artifact is damaged or was rewritten after its manifest; restore it or use --artifact-uri")

    def to_report(self) -> dict[str, Any]:
        return {"kind": self.kind, "location": self.location, "model_path": self.model_path,
                **self.identity.to_dict()}


def resolve_source(
    *,
    ckpt_dir: Path | str | None = None,
    artifact_uri: str | None = None,
    store: ObjectStore | None = None,
    credentials: Credentials | None = None,
    manifest_bytes: bytes | None = None,
) -> ModelSource:
    """``manifest_bytes``: the archived manifest as the caller already read it from ``store`` (not read again)."""
    if ckpt_dir is not None:
        return _local_or_archived(Path(os.path.abspath(ckpt_dir)), credentials)
    assert artifact_uri is not None
    return _archive_source(artifact_uri, store, credentials, manifest_bytes)


def resolve_under_lock(source: ModelSource, credentials) -> ModelSource:
    """A local source resolved again once the output's lock is held: a prune may have removed model.pt
    while the request waited. Then the archive the artifact's receipt names is the source, when its model
    descriptor is the one the local manifest records (same sha256 and size); otherwise the local
    artifact's own refusal stands. An archived source is returned as it is. ``credentials`` (None: the
    default, ``$CKPTFLOW_CREDENTIALS``) open the archive."""
    if source.kind != "ckpt-dir":
        return source
    return _local_or_archived(Path(source.location), credentials)


def _local_or_archived(artifact_dir: Path, credentials) -> ModelSource:
    """The local artifact; once its model.pt was pruned, the archive its receipt names (``_archived_instead``)."""
    try:
        return _local_source(artifact_dir)
    except NotFound:
        archived = _archived_instead(artifact_dir, credentials)
        if archived is None:
            raise
        return archived


def _archived_instead(artifact_dir: Path, credentials) -> ModelSource | None:
    """The archive a receipt names, as the source of the model the local manifest records; None when
    there is no readable receipt or the manifest records no digest to compare with. Every destination the
    receipt lists is tried in its order (the current one first, ``archive.copies.first_serving``): the first
    that is reachable with these credentials and records that model serves; one that does not is skipped
    with a warning naming it. The source remembers the receipt, so a fetch that this destination then
    cannot serve (a damaged object) goes on from the next one (``fetch_model``)."""
    try:
        receipt = receipt_record.read_receipt(artifact_dir)
        manifest = manifest_record.read_manifest(artifact_dir)
    except (CkptflowError, OSError):
        return None
    model = _model_component(manifest, str(artifact_dir))
    if model.sha256 is None:
        return None
    receipt_path = receipt_record.path_in(artifact_dir)

    def attempt(dest) -> ModelSource:
        store, uri = open_copy(dest, credentials, str(receipt_path))
        try:
            archived = _archive_source(str(uri), store, None)
        except (CkptflowError, OSError) as exc:
            raise Unusable(exc) from exc
        if (archived.identity.sha256, archived.identity.size) != (model.sha256, model.size):
            raise Unusable(VerificationFailed(
                f"{artifact_dir / model.path} is gone and the archive its receipt names ({uri}) records model "
                f"{archived.identity.size} bytes sha256 {archived.identity.sha256}, not the {model.size} bytes "
                f"sha256 {model.sha256} of the local manifest", path=str(artifact_dir),
                remedy="restore the payload, or materialize from the right archive with --artifact-uri"))
        return archived

    archived, dest, skipped = first_serving(receipt.destinations, attempt, lister=str(receipt_path),
                                            serves=f"the model of {artifact_dir} (its {model.path} is gone)")
    return replace(archived, copies=ReceiptCopies(artifact_dir, dest, tuple(skipped), credentials))


def _model_component(manifest: manifest_record.Manifest, where: str) -> manifest_record.FileComponent:
    model = manifest.components.get(MODEL_COMPONENT)
    if not isinstance(model, manifest_record.FileComponent):
        found = ("is a DCP directory" if model is not None
                 else f"is absent; its components: {', '.join(sorted(manifest.components)) or 'none'}")
        raise Refused(f"the manifest of {where} has no {MODEL_COMPONENT!r} file component: it {found}",
                      remedy="materialize needs a consolidated model.pt (a trainer's or merge's `model` component), "
                      "or a Hugging Face Trainer artifact (safetensors weights and config.json, or a LoRA adapter)")
    return model


def _local_source(artifact_dir: Path) -> ModelSource:
    try:
        manifest = manifest_record.read_manifest(artifact_dir)
    except NotFound:
        raise NotFound(f"{artifact_dir} has no {manifest_record.FILENAME}: it is not a committed artifact",
                       path=str(artifact_dir),
                       remedy="point --ckpt-dir at checkpoint_artifacts/iter_N of a finished save or merge") from None
    model = _model_component(manifest, str(artifact_dir))
    path = resolve_inside(artifact_dir, model.path, what=f"{manifest_record.FILENAME} model path")
    if not path.is_file():
        raise NotFound(f"{path} (the manifest's model component) is missing", path=str(path),
                       remedy="if the artifact was pruned after publication, materialize from the archive with --artifact-uri")
    size = path.stat().st_size
    if size != model.size:
        raise VerificationFailed(f"{path} has {size} bytes; its manifest records {model.size}", path=str(path),
                                 remedy="the artifact is damaged or was rewritten after its manifest; restore it")
    # A manifest without a digest binds none: the identity is hashed from the file opened under the lock.
    sha256 = model.sha256 or ""
    return ModelSource("ckpt-dir", str(artifact_dir), model.path, SourceIdentity(None, sha256, size), model.sha256,
                       local_path=path, artifact_name=artifact_dir.name, hashed=model.sha256 is None)


def _archive_source(artifact_uri: str, store: ObjectStore | None, credentials,
                    data: bytes | None = None) -> ModelSource:
    artifact = parse_artifact_uri(artifact_uri, what="--artifact-uri")
    uri, name = artifact.uri, artifact.name
    store, prefix = open_uri(uri, store, credentials)
    key = f"{prefix}/{manifest_record.FILENAME}" if prefix else manifest_record.FILENAME
    try:
        data = store.get_bytes(key) if data is None else data
    except NotFound:
        raise NotFound(f"no committed artifact at {uri}: {manifest_record.FILENAME} is missing",
                       remedy="check --artifact-uri and the endpoint in the credentials; an unfinished publication "
                       "is completed by rerunning `ckptflow publish` from the local copy") from None
    manifest = manifest_record.parse_manifest(data, what=f"{manifest_record.FILENAME} at {uri}")
    if manifest.iteration != artifact.iteration:
        raise InvalidRecord(f"{manifest_record.FILENAME} at {uri} records iteration {manifest.iteration}, not the "
                            f"{artifact.iteration} of its prefix", remedy="the archive is misplaced or corrupt; check the URI")
    model = _model_component(manifest, str(uri))
    sha256 = model.sha256
    if sha256 is None:
        info = store.head(f"{prefix}/{model.path}" if prefix else model.path)
        sha256 = info.sha256 if info is not None else None
        if sha256 is None:
            raise Refused(f"{uri}/{model.path} has no digest in the manifest nor in the object's metadata",
                          remedy="republish the artifact from its local copy with `ckptflow publish`")
    return ModelSource("artifact-uri", str(uri), model.path, SourceIdentity(str(uri), sha256, model.size),
                       model.sha256, uri=uri, store=store, artifact_name=name)


@dataclass
class OpenedModel:
    """model.pt opened once: hashed, converted and verified through this one descriptor.

    ``read_path`` (``/proc/self/fd/N``) reopens this inode whatever now lies at ``path``, so a file
    replaced at its path is never read. ``check_unchanged`` compares size and mtime with the values seen
    at open: an in-place rewrite refuses the build when the file system reports it (best effort on a
    networked one; the guarantee of record is against a replaced path)."""

    path: Path
    fd: int
    size: int
    mtime_ns: int

    @classmethod
    def open(cls, path: Path) -> OpenedModel:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NotFound(f"{path} is missing", path=str(path), remedy="restore the artifact, or materialize "
                           "from the archive with --artifact-uri") from None
        st = os.fstat(fd)
        return cls(Path(path), fd, st.st_size, st.st_mtime_ns)

    @property
    def read_path(self) -> Path:
        proc = Path(f"/proc/self/fd/{self.fd}")
        return proc if os.path.exists(proc) else self.path

    def digest(self, progress: bool | None = None) -> FileDigest:
        os.lseek(self.fd, 0, os.SEEK_SET)
        with ByteProgress(self.size, "model.pt sha256", enabled=progress) as bar:
            return sha256_file(self.fd, on_bytes=bar.update)

    def check_unchanged(self) -> None:
        st = os.fstat(self.fd)
        if (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns):
            raise VerificationFailed(
                f"{self.path} changed in place while this request read it (size {self.size} -> {st.st_size}, "
                f"mtime changed: {st.st_mtime_ns != self.mtime_ns}); the build is discarded",
                path=str(self.path), remedy="let the writer finish (write a new file and rename it into place), "
                "then rerun")

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)
