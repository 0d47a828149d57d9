"""Where an artifact's archive lives: the destinations a receipt lists and the checks that bind a receipt and
a store to an artifact, shared by every step that starts from a receipt or publishes.

- ``check_binding``: the receipt belongs to this artifact (``records.receipt.check_belongs``) at the endpoint
  the credentials reach (``check_destination``), and a ``file://`` archive root does not overlap the
  artifact (``refuse_overlapping_archive``, which publish runs before its first read too);
- ``select_destinations``: the destinations of a receipt to check or read (``--destination``), in its order;
- ``earlier_destinations``: the destinations a new receipt keeps besides the one a publication writes; a
  publication elsewhere may not drop the record of where the archive lives.

Verify, prune, release, restore, repair and scrub check through these; none of them contacts a store.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import Refused
from ..records import receipt as receipt_record
from ..store.base import ObjectStore
from ..store.open import check_destination as open_check_destination
from ..store.uri import destination_label, destination_uri


def check_destination(store: ObjectStore, receipt: receipt_record.Receipt, artifact_dir: Path) -> None:
    """Refuse a receipt bound to another endpoint or bucket than the one the credentials reach."""
    open_check_destination(store, receipt.destination, what=str(receipt_record.path_in(artifact_dir)))


def _identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of a directory, None when it cannot be stat'ed."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _same_directory(one: Path, among: tuple[Path, ...]) -> Path | None:
    """The directory of ``among`` that is ``one`` (same device and inode, whatever the path), else None."""
    wanted = _identity(one)
    return next((p for p in among if wanted is not None and _identity(p) == wanted), None)


def refuse_overlapping_archive(store: ObjectStore, artifact_dir: Path) -> None:
    """A ``file://`` archive root that contains the artifact, or lies inside it, would put archive objects
    and metadata into the artifact (or make the local copy its own "remote" one): refused. Paths are
    compared resolved, then directories by device and inode, so the runs tree reached by another mount
    path (a bind mount, a second NFS mount of one export) is caught as well."""
    if store.destination.scheme != "file":
        return
    root = Path(store.destination.endpoint).resolve()
    art = Path(artifact_dir).resolve()
    remedy = "choose a file:// archive root that neither contains nor lies inside the artifact directory"
    if root == art or root in art.parents or art in root.parents:
        raise Refused(
            f"archive root {root} overlaps the artifact {art}: the archive must live outside the runs tree "
            "holding the artifact, and not inside it", remedy=remedy)
    inside = _same_directory(root, (art, *art.parents))  # the root contains the artifact
    within = _same_directory(art, root.parents)  # the root lies inside the artifact
    if inside is not None or within is not None:
        how = (f"the root is {inside}, which holds the artifact, under another mount path" if inside is not None
               else f"{within}, above the root, is the artifact under another mount path")
        raise Refused(
            f"archive root {root} overlaps the artifact {art}: {how} (same device and inode); the archive must "
            "live outside the runs tree holding the artifact, and not inside it", remedy=remedy)


def check_binding(store: ObjectStore, receipt: receipt_record.Receipt, artifact_dir: Path) -> None:
    """The receipt belongs to this artifact (``records.receipt.check_belongs``: its prefix names this
    ``iter_N``, it records this artifact's manifest digest, and that manifest is of iteration N), at the
    endpoint the credentials reach."""
    artifact_dir = Path(artifact_dir)
    check_destination(store, receipt, artifact_dir)
    refuse_overlapping_archive(store, artifact_dir)
    receipt_record.check_belongs(receipt, artifact_dir)


def select_destinations(receipt: receipt_record.Receipt, named: list[str] | tuple[str, ...] | None,
                        where: str) -> list[receipt_record.ReceiptDestination]:
    """The destinations of ``receipt`` to check, in its order (the current one first): every one it lists,
    or those ``named`` (``--destination URI``: a destination's URI, or a URI above it, such as its bucket).
    A name that matches none of them is refused, naming what the receipt lists."""
    if not named:
        return list(receipt.destinations)
    uris = {d: str(destination_uri(d, d.prefix)).rstrip("/") for d in receipt.destinations}
    wanted = [n.rstrip("/") for n in named]
    unknown = [n for n in wanted if not any(u == n or u.startswith(n + "/") for u in uris.values())]
    if unknown:
        raise Refused(f"{where} lists no destination {', '.join(unknown)}: it lists "
                      f"{', '.join(destination_label(d, d.prefix) for d in receipt.destinations)}",
                      remedy="name a destination the receipt lists with --destination, or leave it out to check every one")
    return [d for d, u in uris.items() if any(u == n or u.startswith(n + "/") for n in wanted)]


def earlier_destinations(artifact_dir: Path, dest: receipt_record.ReceiptDestination,
                          add_destination: bool) -> tuple[receipt_record.ReceiptDestination, ...]:
    """The destinations the new receipt keeps besides ``dest``; refuses (before anything is read or
    written) to let a publication elsewhere drop the record of where this artifact's archive lives."""
    existing = receipt_record.belonging_receipt(artifact_dir)
    if existing is None:
        return ()
    if existing.destination != dest and not add_destination:
        def uri(d: receipt_record.ReceiptDestination) -> str:
            return destination_label(d, d.prefix)
        raise Refused(
            f"{receipt_record.path_in(artifact_dir)} records this artifact's archive at {uri(existing.destination)}, "
            f"not at {uri(dest)}: publishing here would replace the only record of that archive",
            path=str(receipt_record.path_in(artifact_dir)),
            remedy="publish to the destination the receipt names, or pass --add-destination to archive the artifact "
            "here as well (the receipt keeps both destinations)",
        )
    return tuple(d for d in existing.destinations if d != dest)
