"""Where an artifact lives in the store, and the remote file names of its records.

The trainer's upload prefix is ``<project>/<group>/<run>/<ts>/checkpoints`` (full checkpoints); an
artifact ``iter_NNNNNN`` goes to the sibling ``<project>/<group>/<run>/<ts>/checkpoint_artifacts/iter_NNNNNN``.
An archived artifact is named by its URI (``parse_artifact_uri``), which fetch and materialize read alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath

from ..artifact import ARTIFACTS_DIR, ITER_DIR_RE
from ..errors import InvalidRecord, UsageError
from ..fsutil import safe_relpath
from ..store.uri import StoreURI, parse_store_uri


def artifact_prefix(upload_prefix: str, artifact_name: str) -> str:
    """The key prefix (no trailing slash) of artifact ``artifact_name`` for a run's upload prefix."""
    cleaned = upload_prefix.strip("/")
    if not cleaned:
        raise UsageError("--upload-prefix is empty", remedy="pass the run's <project>/<group>/<run>/<ts>/checkpoints")
    safe_relpath(cleaned, what="--upload-prefix")
    safe_relpath(artifact_name, what="artifact directory name")
    parent = cleaned.rpartition("/")[0]
    return f"{parent}/{ARTIFACTS_DIR}/{artifact_name}" if parent else f"{ARTIFACTS_DIR}/{artifact_name}"


def object_key(prefix: str, relpath: str) -> str:
    return f"{prefix}/{relpath}" if prefix else relpath


@dataclass(frozen=True)
class ArtifactURI:
    """An archived artifact's URI: ``s3://B/.../iter_N``, ``gs://B/.../iter_N`` or ``file:///DIR/.../iter_N``."""

    uri: StoreURI
    name: str  # iter_N
    iteration: int

    @property
    def prefix(self) -> str:
        """The artifact's key prefix in the store the URI itself opens ("" for ``file://``: it is its own root)."""
        return self.uri.key


def parse_artifact_uri(artifact_uri: str | StoreURI, *, what: str = "artifact URI") -> ArtifactURI:
    """Parse and check an artifact URI; a refusal names ``what`` and the URI and says what to pass."""
    if isinstance(artifact_uri, StoreURI):
        uri = artifact_uri
    else:
        try:
            uri = parse_store_uri(artifact_uri, what=what)
        except InvalidRecord as exc:
            raise UsageError(exc.message, remedy=exc.remedy) from None
    name = PurePosixPath(uri.bucket if uri.scheme == "file" else uri.key).name
    m = ITER_DIR_RE.match(name)
    if not m:
        raise UsageError(f"{what} {uri} does not end in iter_<N>",
                         remedy="pass the artifact's own prefix, .../checkpoint_artifacts/iter_N")
    return ArtifactURI(uri, name, int(m.group(1)))


def receipt_archive_uri(receipt) -> StoreURI:
    """The archived artifact's URI a JSON receipt (``records.receipt.Receipt``) names (``file``: the
    endpoint is the archive root). The workflow's source resolution and materialize read it alike."""
    dest = receipt.destination
    return StoreURI(dest.scheme, dest.endpoint if dest.scheme == "file" else dest.bucket, dest.prefix)
