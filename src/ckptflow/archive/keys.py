"""Where an artifact lives in the store, and the remote file names of its records.

The trainer's upload prefix is ``<project>/<group>/<run>/<ts>/checkpoints`` (full checkpoints); an
artifact ``iter_NNNNNN`` goes to the sibling ``<project>/<group>/<run>/<ts>/checkpoint_artifacts/iter_NNNNNN``.
"""

from __future__ import annotations

from ..errors import UsageError
from ..fsutil import safe_relpath

ARTIFACTS_DIR = "checkpoint_artifacts"


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
