"""Where an artifact lives in the store, and the remote file names of its records.

The trainer's upload prefix is ``<project>/<group>/<run>/<ts>/checkpoints`` (full checkpoints); an
artifact ``iter_NNNNNN`` goes to the sibling ``<project>/<group>/<run>/<ts>/checkpoint_artifacts/iter_NNNNNN``.
An archived artifact is named by its URI (``parse_artifact_uri``), which fetch and materialize read alike.

``upload_prefix_for`` is the one place that decides a publication's upload prefix, for the CLI, the
trainer and the workflow alike: an artifact in the runs layout
``<runs_root>/<project>/<group>/<run>/<ts>/checkpoint_artifacts/iter_N`` (``<ts>`` the attempt's UTC start,
``YYYYMMDDTHHMMSSZ``) derives ``<project>/<group>/<run>/<ts>/checkpoints`` from its own path: the four
directories above ``checkpoint_artifacts``, whatever the depth of ``runs_root``, so every front end derives
the same prefix (the workflow's ``run_tree_upload_prefix`` takes this derivation, whatever its ``run``
wildcard holds, and uses the wildcard only outside the layout, where nothing is derived). An explicit prefix
must end in ``checkpoints`` and, in the runs layout, be the derived one, whole: archives are create-once,
so a prefix that would put one anywhere else (another project's, with the same run and attempt names) is
refused before anything is written. A run tree not laid out as ``<project>/<group>/<run>/<ts>`` (its path
then derives a prefix that names no project of it) publishes under an explicit ``UnderivedPrefix``
(``ckptflow publish --upload-prefix P --outside-runs-layout``): taken as given, and said so on stderr.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..artifact import ARTIFACTS_DIR, ITER_DIR_RE
from ..errors import InvalidRecord, UsageError
from ..fsutil import safe_relpath
from ..store.uri import StoreURI, destination_uri, parse_store_uri


def artifact_prefix(upload_prefix: str, artifact_name: str) -> str:
    """The key prefix (no trailing slash) of artifact ``artifact_name`` for a run's upload prefix."""
    cleaned = upload_prefix.strip("/")
    if not cleaned:
        raise UsageError("--upload-prefix is empty", remedy="pass the run's <project>/<group>/<run>/<ts>/checkpoints")
    safe_relpath(cleaned, what="--upload-prefix")
    safe_relpath(artifact_name, what="artifact directory name")
    parent = cleaned.rpartition("/")[0]
    return f"{parent}/{ARTIFACTS_DIR}/{artifact_name}" if parent else f"{ARTIFACTS_DIR}/{artifact_name}"


log = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"  # the last segment of every upload prefix
ATTEMPT_RE = re.compile(r"^\d{8}T\d{6}Z")  # an attempt directory <ts>, perhaps with a -fresh-... suffix


def run_upload_prefix(run: str) -> str:
    """The upload prefix of a run ``<project>/<group>/<run>/<ts>`` (relative to the runs root)."""
    return f"{run.strip('/')}/{CHECKPOINTS_DIR}"


def derived_upload_prefix(artifact_dir: Path | str) -> str | None:
    """``<project>/<group>/<run>/<ts>/checkpoints`` of an artifact in the runs layout, None outside it."""
    parts = Path(os.path.abspath(artifact_dir)).parts
    if len(parts) < 7 or parts[-2] != ARTIFACTS_DIR or not ITER_DIR_RE.match(parts[-1]) \
            or not ATTEMPT_RE.match(parts[-3]):
        return None
    return run_upload_prefix("/".join(parts[-6:-2]))


class UnderivedPrefix(str):
    """An explicit upload prefix for a run tree not laid out as ``<project>/<group>/<run>/<ts>``
    (``--outside-runs-layout``): it must still end in ``checkpoints``, but is not compared with the prefix
    the artifact's path derives; ``upload_prefix_for`` says on stderr that it took it as given."""


OVERRIDE = "--outside-runs-layout"


def upload_prefix_for(artifact_dir: Path | str, explicit: str | None) -> str:
    """The upload prefix to publish ``artifact_dir`` under: ``explicit`` when given and consistent with
    the artifact's path (or an ``UnderivedPrefix``), else the one derived from it; anything else is refused by
    name, remedy included."""
    derived = derived_upload_prefix(artifact_dir)
    if explicit is None:
        if derived is None:
            raise UsageError(
                f"{artifact_dir} is not in the runs layout <runs_root>/<project>/<group>/<run>/<ts>/"
                f"{ARTIFACTS_DIR}/iter_N (<ts> as YYYYMMDDTHHMMSSZ), so no upload prefix can be derived from it",
                remedy="pass --upload-prefix <project>/<group>/<run>/<ts>/checkpoints")
        return derived
    cleaned = explicit.strip("/")
    segments = cleaned.split("/")
    remedy = (f"pass --upload-prefix {derived}, or leave it out: it is derived from the artifact's path" if derived
              else "pass the run's <project>/<group>/<run>/<ts>/checkpoints")
    if segments[-1] != CHECKPOINTS_DIR:
        raise UsageError(
            f"--upload-prefix {explicit!r} does not end in /{CHECKPOINTS_DIR}: {artifact_dir} would be archived at "
            f"{artifact_prefix(cleaned, Path(artifact_dir).name) if cleaned else 'an empty prefix'}, "
            "not beside the run's checkpoints; nothing was written", remedy=remedy)
    if derived is not None and cleaned != derived:
        if isinstance(explicit, UnderivedPrefix):
            log.warning("%s: publishing under --upload-prefix %s as given (%s), not under %s, the prefix its path "
                        "derives", artifact_dir, cleaned, OVERRIDE, derived)
            return cleaned
        raise UsageError(
            f"--upload-prefix {explicit!r} is not {derived}, the prefix of {artifact_dir}'s own "
            "<project>/<group>/<run>/<ts>: the archive would land where another run's belongs; nothing was written",
            remedy=f"{remedy} (a run tree not laid out as <project>/<group>/<run>/<ts>: add {OVERRIDE} to take "
            "--upload-prefix as given)")
    return cleaned


def run_tree_upload_prefix(artifact_dir: Path | str, run: str) -> str:
    """The upload prefix of an artifact a workflow finds at ``<runs_root>/<run>/checkpoint_artifacts/iter_N``:
    in the runs layout the derived one (as the CLI and the trainer derive it, whatever the depth of runs_root:
    ``run`` may hold more or fewer segments than ``<project>/<group>/<run>/<ts>``); outside it, where nothing can
    be derived, ``<run>/checkpoints``, the explicit prefix the CLI then needs."""
    derived = derived_upload_prefix(artifact_dir)
    return derived if derived is not None else run_upload_prefix(run)


def run_tree_artifact_prefix(artifact_dir: Path | str, run: str) -> str:
    """The key prefix (``.../checkpoint_artifacts/iter_N``) of such an artifact (``run_tree_upload_prefix``)."""
    return artifact_prefix(run_tree_upload_prefix(artifact_dir, run), Path(artifact_dir).name)


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
    return destination_uri(receipt.destination, receipt.destination.prefix)
