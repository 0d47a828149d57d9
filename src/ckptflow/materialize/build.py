"""The steps of ``materialize`` under the lock once it decided to build: the fetch of an archived model.pt
into its stage, the staged build, and the recovery of a killed run's complete staged tree. The build and
the recovery each end in one swap into place (``output.swap_into_place``) and return a ``Built``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import testhooks
from ..conversion import chat_template
from ..digest import hash_files
from ..errors import CkptflowError, OutOfSpace, Refused, VerificationFailed
from ..fsutil import fsync_dir
from ..records.inventory import FileEntry
from ..records.materialized import Materialized, read_materialized, write_materialized
from . import recovery
from .identity import Identity
from .output import Decision, building, staged_tree, swap_into_place
from .source import MODEL_COMPONENT, ModelSource, OpenedModel
from .staging import Stage

if TYPE_CHECKING:
    from ..conversion import VerificationSummary
    from .run import MaterializeRequest

log = logging.getLogger("ckptflow.materialize")

_RACE_LOST = "a concurrent request published the same identity first"


@dataclass(frozen=True)
class Built:
    """What a build or a recovery put at <out>. ``status`` "skipped": a concurrent request of the same
    identity took <out> first and ``record`` is its marker (this run's tree was discarded)."""

    status: str  # "built" or "skipped"
    reason: str
    record: Materialized
    verification: VerificationSummary | None = None
    recovered_from: Path | None = None  # the killed run's staged tree that was recovered


def fetch_model(source: ModelSource, stage: Stage, progress, reserve: int) -> tuple[Path, dict, ModelSource]:
    """Fetch into the stage's iter_N. Every staged byte the build reads was hashed by this fetch (downloaded
    and verified, or re-hashed in an existing copy) against the digest the source identity records.
    ``reserve``: bytes the staged export needs afterwards on the stage's file system (its free-space check).
    A source resolved through a pruned artifact's receipt is fetched from the destination that served it,
    else from the next ones the receipt lists (``archive.copies.fetch_from_receipt``).
    Returns the staged model.pt, the fetch's part of the report and the source as it was fetched."""
    from ..archive.copies import fetch_from_receipt
    from ..archive.fetch import fetch_artifact
    from ..records.manifest import parse_manifest

    options = {"progress": progress, "reserve": reserve, "reserve_for": "the staged export of the teacher beside --out",
               "components": {MODEL_COMPONENT}}  # the conversion reads model.pt alone
    try:
        if source.copies is None:
            result = fetch_artifact(source.uri, stage.root, store=source.store, **options)
        else:
            copies = source.copies
            result, dest, skipped = fetch_from_receipt(copies.artifact_dir, stage.root, copies.credentials,
                                                       destinations=copies.remaining(), **options)
            source = source.served_by(dest, skipped)
    except OutOfSpace as exc:
        if stage.private and not isinstance(exc, Refused):  # what it wrote goes with the private stage
            exc.add_context(
                after=f"; materialize then removes its private stage {stage.root}",
                remedy=(f"free space on the file system of {stage.root} ({exc.needed} bytes were still to "
                        f"write, {exc.free} free), then rerun; --keep-staged keeps a partial fetch for the rerun"))
        raise
    testhooks.reached("materialize:after-fetch")
    model = parse_manifest(result.plan.manifest_bytes, what=f"manifest fetched from {source.location}").components.get("model")
    if model is None or (model.path, model.size, getattr(model, "sha256", None)) != (
            source.model_path, source.identity.size, source.manifest_sha256):
        raise VerificationFailed(f"the manifest at {source.location} changed while this request ran",
                                 remedy="rerun the command; an archived manifest is immutable, so check the archive")
    verified = {e.path: e for e in result.plan.payloads}.get(source.model_path)
    if verified is None or (verified.size, verified.sha256) != (source.identity.size, source.identity.sha256):
        raise VerificationFailed(f"the staged {source.model_path} in {result.path} was verified against another "
                                 f"digest than the source identity {source.identity.sha256}",
                                 path=str(result.path / source.model_path),
                                 remedy="the archive's records disagree; check the archive or republish the artifact")
    fetched = {"status": result.status, "path": str(result.path), "downloaded": result.downloaded,
               "downloaded_bytes": result.downloaded_bytes}
    return result.path / source.model_path, fetched, source


def build(req: MaterializeRequest, opened: OpenedModel, wanted: Identity, decision: Decision,
          unified: chat_template.Unified | None) -> Built:
    """Convert into a fresh staged tree, verify it, write its marker, swap it into place."""
    from ..conversion import convert_checkpoint, verify_output
    from ..conversion.verify import check_loaders

    out, base_dir, progress = req.out, req.base_dir, req.progress
    with staged_tree(out) as tmp:
        with _step("overlay", out):
            conversion = convert_checkpoint(opened.read_path, base_dir, tmp, max_shard_bytes=req.max_shard_bytes,
                                            progress=progress)
        testhooks.reached("materialize:after-convert")
        if unified is not None:
            with _step("sidecars", out):
                chat_template.write_unified(tmp, unified)
        with _step("verify", out):
            summary = verify_output(tmp, base_dir, opened.read_path if req.verify_tensors else None,
                                    expect_tensors=req.expect_tensors, min_tensors=req.min_tensors,
                                    verify_tensors=req.verify_tensors, unified_chat_template=unified is not None)
            summary = check_loaders(tmp, summary)
            opened.check_unchanged()  # the bytes converted and verified are the bytes the identity names
        digests = hash_files(tmp, [s.name for s in conversion.shards], progress=progress, desc="materialize sha256")
        record = Materialized(
            conversion_version=wanted.conversion_version, source=wanted.source, base=wanted.base,
            options=wanted.options, shards=tuple(FileEntry(p, d.size, d.sha256) for p, d in digests.items()),
            tensor_count=conversion.tensor_count, chat_template=unified.record() if unified is not None else None,
        )
        write_materialized(tmp, record)
        fsync_dir(tmp)
        testhooks.reached("materialize:after-marker")
        testhooks.reached("materialize:before-swap")
        with _step("swap", out):
            taken = swap_into_place(tmp, out, wanted, replace=decision.replace, base_dir=base_dir)
    if taken is not None:  # lost a race to a request of the same identity; ours was discarded
        return Built("skipped", _RACE_LOST, taken)
    return Built("built", decision.reason, record, summary)


@contextlib.contextmanager
def _step(name: str, out: Path):
    """Name the step of the staged build in a failure's message (the staged tree is then removed and the
    existing output is as it was, except where the swap itself says otherwise)."""
    try:
        yield
    except CkptflowError as exc:
        exc.add_context(before=f"materialize {name} stage failed for {out}: ")
        raise


def recover(req: MaterializeRequest, tmp: Path, opened: OpenedModel, wanted: Identity, decision: Decision,
            unified: chat_template.Unified | None) -> Built | None:
    """Swap a killed run's complete staged tree of this identity into place (``recovery.py``); None when
    another request adopted it first. A failed check refuses by name and keeps the tree (under this run's name)."""
    out, base_dir = req.out, req.base_dir
    own = recovery.adopt(tmp, out)
    if own is None:
        return None
    try:
        record = read_materialized(own)
        synced = recovery.resync_sidecars(own, base_dir, unified)
        summary = recovery.check_recovered(own, base_dir, record, opened.read_path if req.verify_tensors else None,
                                           expect_tensors=req.expect_tensors, min_tensors=req.min_tensors,
                                           progress=req.progress, unified=unified)
        opened.check_unchanged()
    except CkptflowError as exc:
        state = "absent" if not os.path.lexists(out) else "an empty directory"
        raise Refused(f"the complete staged tree {tmp} of a killed materialize (kept, now {own.name}) failed its "
                      f"recovery check: {exc.message}; {out} is {state}", path=str(own),
                      remedy="inspect it; rerun with --force to build afresh (the kept tree is removed once "
                      f"{out} is complete), or remove it yourself") from None
    finally:
        building.unclaim(own)
    if synced:
        log.warning("re-synced %s in the recovered tree %s from the base", ", ".join(synced), own)
    testhooks.reached("materialize:before-swap")
    taken = swap_into_place(own, out, wanted, replace=decision.replace, base_dir=base_dir)
    if taken is not None:  # a concurrent request published the same identity: ours is a spare copy
        shutil.rmtree(own, ignore_errors=True)
        return Built("skipped", _RACE_LOST, taken)
    return Built("built", f"recovered: the complete staged tree of a killed run ({tmp.name}), verified", record,
                 summary, recovered_from=tmp)
