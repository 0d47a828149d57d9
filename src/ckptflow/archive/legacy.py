"""Converting a legacy merge manifest to the native schema, keeping its original bytes.

The retired merge tool wrote ``.posttrain-checkpoint-artifact.json`` without the ``schema`` field, in
one of two shapes::

    {"iteration": 300, "model": "model.pt"}                       # the consolidated model only
    {"iteration": 300, "components": {"model": {"format": "file", "path": "model.pt", ...}}}

Publication converts it once: the original bytes go to ``.posttrain-checkpoint-artifact.legacy.json``
(written first, byte for byte, and archived with the artifact), then the native manifest replaces the
legacy one. A crash between the two writes leaves the legacy manifest in place and the same original
bytes preserved, so a rerun converts again; preserved bytes that differ from the current legacy
manifest are never overwritten.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .. import __version__
from ..errors import ConflictError, InvalidRecord
from ..jsonio import decode_json_object
from ..records import legacy_manifest as legacy_record
from ..records import manifest as manifest_record

log = logging.getLogger(__name__)


def convert_legacy_manifest(artifact_dir: Path) -> manifest_record.Manifest:
    """Convert the legacy manifest in ``artifact_dir``; return the native manifest now committed."""
    path = manifest_record.path_in(artifact_dir)
    original = path.read_bytes()
    legacy = decode_json_object(original, what=str(path))
    native = manifest_record.Manifest.from_dict(_native_dict(legacy, artifact_dir, str(path)), what=str(path))
    preserved = legacy_record.path_in(artifact_dir)
    if preserved.exists():
        if legacy_record.read_legacy_manifest(artifact_dir) != original:
            raise ConflictError(
                f"{preserved} holds other original bytes than the legacy manifest {path}",
                remedy="inspect both files; ckptflow never overwrites preserved original bytes",
            )
    else:
        legacy_record.write_legacy_manifest(artifact_dir, original)
    manifest_record.write_manifest(artifact_dir, native)
    log.info("converted legacy manifest %s (original kept in %s)", path, preserved.name)
    return native


def _native_dict(legacy: dict, artifact_dir: Path, what: str) -> dict:
    iteration = legacy.get("iteration")
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise InvalidRecord(f"legacy manifest {what} has no valid 'iteration'", remedy="seal the artifact with `ckptflow seal`")
    if isinstance(legacy.get("components"), dict):
        components = legacy["components"]
    elif isinstance(legacy.get("model"), str):
        model = legacy["model"]
        model_path = artifact_dir / model
        if not model_path.is_file():
            raise InvalidRecord(f"legacy manifest {what} names {model!r}, which is not a file in {artifact_dir}")
        components = {"model": {"format": "file", "path": model, "size": model_path.stat().st_size}}
    else:
        raise InvalidRecord(
            f"legacy manifest {what} has neither 'components' nor 'model'",
            remedy="it is not a merge manifest ckptflow knows; seal the artifact with `ckptflow seal` into a new iter_* directory",
        )
    return {
        "schema": manifest_record.SCHEMA,
        "iteration": iteration,
        "components": components,
        "producer": {"tool": "ckptflow legacy conversion", "version": __version__},
    }
