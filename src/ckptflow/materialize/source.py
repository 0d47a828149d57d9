"""Where ``materialize`` takes model.pt from, and the source identity of record, read without payloads.

* ``--ckpt-dir DIR``: a local artifact (trainer or merge output). Its native manifest must have a ``model``
  component of format ``file``. The identity is that descriptor (size + sha256); the local file's size is
  checked at once and its digest before a build (``verified_local_path``), so a skip never reads it. A
  manifest without a digest (trainers may not hash) makes the file be hashed for the identity itself.
* ``--artifact-uri URI``: an archived artifact (``s3://``, ``gs://``, ``file://`` ending in ``iter_N``). Only
  the remote native manifest is read (one small GET); a manifest without a digest for the model falls
  back to the object's ``sha256`` metadata (HEAD), as fetch does for legacy archives. The payload is
  fetched by ``archive.reader.fetch_artifact`` only when a build needs it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..archive.keys import parse_artifact_uri
from ..digest import hash_files
from ..errors import InvalidRecord, NotFound, Refused, VerificationFailed
from ..fsutil import resolve_inside
from ..records import manifest as manifest_record
from ..records.materialized import SourceIdentity
from ..store import Credentials, StoreURI
from ..store.base import ObjectStore
from ..store.open import open_uri

MODEL_COMPONENT = "model"


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

    def verified_local_path(self, *, progress: bool | None = None) -> Path:
        """The local model.pt after checking its size and content hash against the identity (one read)."""
        assert self.local_path is not None
        if self.hashed:
            return self.local_path
        root = Path(self.location)
        digest = hash_files(root, [self.model_path], progress=progress, desc="model.pt sha256")[self.model_path]
        if (digest.size, digest.sha256) != (self.identity.size, self.identity.sha256):
            raise VerificationFailed(
                f"{self.local_path} has {digest.size} bytes sha256 {digest.sha256}; its manifest records "
                f"{self.identity.size} bytes sha256 {self.identity.sha256}", path=str(self.local_path),
                remedy="the artifact is damaged or was rewritten after its manifest; restore it or use --artifact-uri")
        return self.local_path

    def to_report(self) -> dict[str, Any]:
        return {"kind": self.kind, "location": self.location, "model_path": self.model_path,
                **self.identity.to_dict()}


def resolve_source(
    *,
    ckpt_dir: Path | str | None = None,
    artifact_uri: str | None = None,
    store: ObjectStore | None = None,
    credentials: Credentials | None = None,
) -> ModelSource:
    if ckpt_dir is not None:
        return _local_source(Path(os.path.abspath(ckpt_dir)))
    assert artifact_uri is not None
    return _archive_source(artifact_uri, store, credentials)


def _model_component(manifest: manifest_record.Manifest, where: str) -> manifest_record.FileComponent:
    model = manifest.components.get(MODEL_COMPONENT)
    if not isinstance(model, manifest_record.FileComponent):
        found = "a DCP directory" if model is not None else f"absent (components: {sorted(manifest.components)})"
        raise Refused(f"the manifest of {where} has no {MODEL_COMPONENT!r} file component ({found})",
                      remedy="materialize needs a consolidated model.pt (a trainer's or merge's `model` component)")
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
    sha256 = model.sha256
    if sha256 is None:  # the manifest binds no digest: the identity must come from the bytes themselves
        sha256 = hash_files(artifact_dir, [model.path], desc="model.pt sha256")[model.path].sha256
    return ModelSource("ckpt-dir", str(artifact_dir), model.path, SourceIdentity(None, sha256, size), model.sha256,
                       local_path=path, artifact_name=artifact_dir.name, hashed=model.sha256 is None)


def _archive_source(artifact_uri: str, store: ObjectStore | None, credentials) -> ModelSource:
    artifact = parse_artifact_uri(artifact_uri, what="--artifact-uri")
    uri, name = artifact.uri, artifact.name
    store, prefix = open_uri(uri, store, credentials)
    key = f"{prefix}/{manifest_record.FILENAME}" if prefix else manifest_record.FILENAME
    try:
        data = store.get_bytes(key)
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
