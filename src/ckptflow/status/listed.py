"""The local column of ``ckptflow ls --runs-root``: each listed artifact's local copy, as ``status`` judges it.

``attach_local`` reads the runs root once (``collect_status``) and gives each artifact of a ``Listing``
one word: ``local`` (committed, every payload here), ``pruned`` (payloads gone, receipt kept), ``partial``
/ ``missing`` (some gone), ``absent`` (no directory), or status's own state when the directory is not
committed (incomplete, damaged, corrupt, ...). A word that speaks for this archive (``local``, ``pruned``,
...) is given only to a copy bound to it: its manifest has the digest the archive declares and, when it
has a receipt, that receipt names this place and binds the declaration read here. Otherwise the copy is
``foreign`` (its receipt was written for another artifact), ``elsewhere`` (its receipt names other
destinations), ``differs`` (another declaration, or another manifest) or ``unbound`` (the archive holds
no record that binds a manifest). Rows are matched by run, ``<project>/<group>/<run>/<ts>``: the last four
path segments before ``checkpoint_artifacts``, on both sides, as status names a run.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..archive.listing import CORRUPT, ArchivedArtifact, Listing
from ..artifact import RUN_DEPTH
from ..digest import sha256_bytes
from ..errors import CkptflowError
from ..records import MANIFEST_FILENAME, read_receipt
from ..records.receipt import ReceiptDestination
from ..store.uri import destination_label
from .collect import collect_status
from .report import Row


def attach_local(listing: Listing, destination: Any, runs_root: Path) -> Listing:
    """Set each artifact's ``local`` cell from ``runs_root``; ``destination`` is the listed store's."""
    rows = {(_run_key(r.run), r.iteration): r for r in collect_status(runs_root).rows if r.artifact_dir is not None}
    for art in listing.artifacts:
        here = ReceiptDestination.at(destination, art.prefix)
        art.local = local_state(rows.get((_run_key(art.run), art.iteration)), art, here)
    listing.runs_root = runs_root
    return listing


def _run_key(run: str) -> str:
    return "/".join(run.split("/")[-RUN_DEPTH:])


def local_state(row: Row | None, art: ArchivedArtifact, here: ReceiptDestination) -> dict[str, Any]:
    """The local cell of ``art`` (which lives at ``here``) for status's ``row`` of the same run and iteration."""
    if row is None:
        return {"state": "absent"}
    out: dict[str, Any] = {"path": str(row.artifact_dir)}
    if row.local["state"] != "committed":
        cell = row.local
    elif (other := _not_bound(row, art, here)) is not None:
        cell = other
    elif row.pruned["state"] in ("pruned", "partial", "missing"):
        cell = row.pruned
    else:
        cell = {"state": "local"}
    out["state"] = cell["state"]
    if cell.get("detail"):
        out["detail"] = cell["detail"]
    return out


def _place(dest: ReceiptDestination) -> tuple[str, ...]:
    """A destination as one place: a file:// root and prefix name one path however the root was chosen."""
    if dest.scheme == "file":
        return "file", os.path.realpath(os.path.join(dest.endpoint, dest.prefix.strip("/")))
    return dest.scheme, dest.endpoint, dest.bucket, dest.prefix.strip("/")


def _where(dest: ReceiptDestination) -> str:
    return destination_label(dest, dest.prefix)


def _not_bound(row: Row, art: ArchivedArtifact, here: ReceiptDestination) -> dict[str, Any] | None:
    """The cell of a committed local copy that is not this archive's copy; None when it is."""
    if row.published["state"] == "foreign":
        return {"state": "foreign", "detail": f"{row.published['detail']}; it proves nothing about {art.uri}"}
    if row.published["state"] == "receipt":
        try:
            receipt = read_receipt(row.artifact_dir)
        except (CkptflowError, OSError) as exc:
            return {"state": CORRUPT, "detail": str(exc)}
        if _place(here) not in {_place(d) for d in receipt.destinations}:
            return {"state": "elsewhere", "detail": (
                f"{row.artifact_dir}'s receipt names {_where(receipt.destination)}, not {_where(here)}: this local "
                "copy was published there; list that archive to see it")}
        declaration = art.declaration_bytes()
        if declaration is not None and sha256_bytes(declaration) != receipt.declaration_sha256:
            return {"state": "differs", "detail": (
                f"{row.artifact_dir}'s receipt binds declaration sha256 {receipt.declaration_sha256}, but "
                f"{_where(here)} holds {sha256_bytes(declaration)}: the archive was published again from another "
                "copy; run `ckptflow verify --artifact-dir` on this copy")}
    manifest = row.artifact_dir / MANIFEST_FILENAME
    if art.manifest_sha256 is None or art.state == CORRUPT:
        return {"state": "unbound", "detail": (
            f"{art.uri} is {art.state} and binds no manifest to compare {manifest} with: nothing proves this local "
            "copy is the archived one; list a committed archive of it, or publish it")}
    if art.manifest_sha256 != row.manifest_sha256:
        return {"state": "differs", "detail": (
            f"{manifest} has sha256 {row.manifest_sha256}, but {art.uri} binds {art.manifest_sha256}: this local "
            "copy holds other bytes than the archived artifact; fetch the archived one elsewhere, or publish "
            "this one under its own prefix")}
    return None
