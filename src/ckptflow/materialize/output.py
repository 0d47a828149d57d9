"""The output side of ``materialize``: the decision on what is at <out>, ownership, and the staged swap.

Sibling names beside ``<out>`` (same directory, so every rename stays on one file system)::

    teacher/                                  the output; complete iff it holds .materialized
    teacher.tmp.<host>.<pid>.<token>/         a staged build (this process's own, never shared)
    teacher.previous.<host>.<pid>.<token>/    the replaced output during a swap, removed right after

The names carry host and pid because ``flock`` is silently a no-op on some Lustre/GPFS/NFS mounts: no two
processes can pick the same staged name, and each step that puts a tree in place is one ``rename``. A sibling whose
writer is gone (this host, dead pid) is a leftover of a killed run: a staged tree is removed by the next
build (one with a marker only once <out> is complete: ``recovery.py``); a previous tree is renamed back
to <out> when <out> is absent (the kill fell between the swap's two renames), and otherwise removed by a
forced build once <out> is complete again. A staged tree is private to its writer and is
removed whole; of a previous tree (a user's <out>) only the files a build writes are removed
(``build_files``), and a tree still holding anything else is kept.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .. import testhooks
from ..conversion import chat_template
from ..conversion import shards as hf_shards
from ..conversion import sidecars as hf_sidecars
from ..errors import CkptflowError, ConflictError, InvalidRecord, NotFound, Refused
from ..fsutil import InFlight, dead_temporaries, fsync_dir, tagged_name
from ..records import LegacyRecord
from ..records import materialized as marker
from ..records.inventory import damaged_entry
from ..records.materialized import Materialized
from .identity import Identity

log = logging.getLogger("ckptflow.materialize")

building = InFlight()  # staged trees this process is building now (several calls may share a process)


@dataclass(frozen=True)
class Decision:
    action: str  # "skip" or "build"
    reason: str
    replace: bool = False  # <out> holds a tree that the build swaps out
    previous: Materialized | None = None


# --------------------------------------------------------------------------------------------- decide


def decide(out: Path, wanted: Identity, base_dir: Path | None, *, force: bool) -> Decision:
    """Skip, build, or raise ``Refused`` (nothing touched); see ``run``'s module doc for the table.

    A build that replaces <out> is refused while <out> holds a file no build writes (``unaccounted``).
    ``base_dir`` None: a teacher whose marker lists every file it holds (``hf_artifact``: a build from a
    Hugging Face Trainer artifact), judged by that inventory alone.
    """
    decision = _decide(out, wanted, base_dir, force=force)
    if decision.replace:
        refuse_unaccounted(out, unaccounted(out, base_dir, decision.previous))
    return decision


def _decide(out: Path, wanted: Identity, base_dir: Path | None, *, force: bool) -> Decision:
    if not os.path.lexists(out):
        return Decision("build", "no previous output")
    if out.is_symlink() or not out.is_dir():
        raise Refused(f"--out {out} exists and is not a directory (a file or a symlink)", path=str(out),
                      remedy="move it away or choose another --out; ckptflow never deletes what it did not write")
    path = marker.path_in(out)
    if not os.path.lexists(path):
        with os.scandir(out) as entries:
            empty = next(entries, None) is None
        if empty:
            return Decision("build", "empty output directory")
        raise Refused(f"{out} holds files but no {marker.FILENAME}: it was not built by ckptflow materialize",
                      path=str(out), remedy="move it away or choose another --out; ckptflow never deletes what it "
                      "did not write (--force does not change that)")
    try:
        if path.is_symlink():
            raise InvalidRecord(f"{path} is a symlink")
        old = marker.read_materialized(path)
    except LegacyRecord as exc:
        if not force:
            raise Refused(f"{out} was built by an older materializer ({exc.message}); this request is "
                          f"{wanted.describe()}", path=str(out),
                          remedy="rerun with --force to rebuild it with this conversion, or choose another --out") from None
        return Decision("build", "forced: replaces the output of an older materializer", True)
    except InvalidRecord as exc:
        if not force:
            raise Refused(f"{out}: its {marker.FILENAME} cannot be read ({exc})", path=str(path),
                          remedy="inspect it; rerun with --force to rebuild over it, or choose another --out") from None
        return Decision("build", "forced: replaces an output with an unreadable marker", True)
    have = Identity.of(old)
    diffs = have.differences(wanted)
    if diffs:
        if not force:
            older = " (outputs of another conversion version must be rebuilt)" if have.conversion_version != \
                wanted.conversion_version else ""
            raise Refused(f"{out} holds the completed build {have.describe()}; this request is {wanted.describe()}; "
                          f"they differ in: {', '.join(diffs)}{older}", path=str(out),
                          remedy="rerun with --force to replace it, or choose another --out")
        return Decision("build", f"forced: replaces a build that differs in {', '.join(diffs)}", True, old)
    if force:
        return Decision("build", "forced: rebuilds the same request", True, old)
    damage = damage_of(out, old, base_dir)
    if damage:
        return Decision("build", f"rebuilt: {damage}", True, old)
    if base_dir is None:
        return Decision("skip", "the same request's output is complete and intact (every file its marker lists, "
                        "by size, and by sha256 but the weights)", False, old)
    return Decision("skip", "the same request's output is complete and intact (marker, shard sizes, index, "
                    "config and sidecars; shards are not re-hashed)", False, old)


def damage_of(out: Path, record: Materialized, base_dir: Path | None) -> str | None:
    """Why a marked output is not intact, or None. Cheap: sizes and small files, no shard is read.
    ``base_dir`` None: the marker lists every file of the output; each must have its recorded size, and
    the small ones (not weights) their recorded sha256."""
    if base_dir is None:
        weights = [e for e in record.shards if hf_shards.is_weight_file(e.path)]
        small = [e for e in record.shards if not hf_shards.is_weight_file(e.path)]
        problem = (damaged_entry(out, weights, record="the marker", rehash=False)
                   or damaged_entry(out, small, record="the marker", rehash=True))
        return f"file {problem}" if problem else None
    problem = damaged_entry(out, record.shards, record="the marker", rehash=False)
    if problem:
        return f"shard {problem}"
    try:
        index = hf_shards.read_index(out, what="output")
    except CkptflowError as exc:
        return f"its index is unreadable ({exc.message})"
    if index.path.name != hf_shards.INDEX_NAME:
        return f"{hf_shards.INDEX_NAME} is missing"
    if index.shards() != sorted(e.path for e in record.shards) or len(index.weight_map) != record.tensor_count:
        return f"{hf_shards.INDEX_NAME} does not list the marker's shards and tensor count"
    try:
        files = hf_sidecars.list_sidecars(base_dir).files
        expected = None
        if record.options.get(chat_template.OPTION):
            unified = chat_template.unify(base_dir)
            if record.chat_template != unified.record():
                return "its marker's chat_template record is not the one the base's templates give now"
            expected = unified.expected()
        hf_sidecars.check_identical(base_dir, out, files, expected)
    except CkptflowError as exc:
        return exc.message
    return None


# --------------------------------------------------------------------------------------------- ownership

_SHARD_RE = re.compile(r"^model-[0-9]{5}-of-[0-9]{5}\.safetensors$")  # conversion.shards.shard_name
_LISTED = 20  # unaccounted files named in a refusal


def build_files(base_dir: Path | None, record: Materialized | None) -> set[str]:
    """The paths a build writes into its tree (besides shards named like ``shard_name``): what a rebuild
    may remove from <out>. The marker, config.json, the index, the files the marker lists, the base's
    sidecars (``base_dir`` None: a build from a Trainer artifact, whose marker lists all of its files)."""
    files = {marker.FILENAME, hf_sidecars.CONFIG_NAME, hf_shards.INDEX_NAME}
    if base_dir is None and record is not None and "trainer_artifact" not in record.options:
        base_dir = _recorded_base(record)  # a model.pt teacher replaced by a Trainer one: its base's sidecars
    if base_dir is not None:
        files.update(hf_sidecars.list_sidecars(base_dir).files)
    if record is not None:
        files.update(e.path for e in record.shards)
    return files


def _recorded_base(record: Materialized) -> Path | None:
    """The base directory a model.pt teacher's marker records, while it is one (else its sidecars are unknown)."""
    path = Path(record.base.path)
    return path if path.is_absolute() and path.is_dir() else None


def _walk(tree: Path, prefix: str = "") -> Iterator[tuple[str, bool]]:
    """(relative path, is a directory) for every entry under ``tree``, children before their directory."""
    with os.scandir(tree) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        rel = prefix + entry.name
        if entry.is_dir(follow_symlinks=False):
            yield from _walk(Path(entry.path), rel + "/")
            yield rel, True
        else:
            yield rel, False


def _accounted(rel: str, files: set[str]) -> bool:
    return rel in files or ("/" not in rel and _SHARD_RE.match(rel) is not None)


def _build_dirs(files: set[str]) -> set[str]:
    return {d.as_posix() for f in files for d in PurePosixPath(f).parents if d.as_posix() != "."}


def unaccounted(tree: Path, base_dir: Path | None, record: Materialized | None) -> list[str]:
    """Entries of ``tree`` no build writes (user files, their directories), sorted; nothing followed."""
    files = build_files(base_dir, record)
    dirs = _build_dirs(files)
    found: list[str] = []
    for rel, is_dir in _walk(tree):
        if not is_dir:
            if not _accounted(rel, files):
                found.append(rel)
        elif rel not in dirs and not any(f.startswith(rel + "/") for f in found):
            found.append(rel + "/")  # someone else's directory, empty
    return sorted(found)


def refuse_unaccounted(out: Path, names: list[str]) -> None:
    if not names:
        return
    shown = ", ".join(names[:_LISTED]) + (f" and {len(names) - _LISTED} more" if len(names) > _LISTED else "")
    raise Refused(f"{out} holds {len(names)} file(s) that no build writes: {shown}; a rebuild replaces the output "
                  "and removes only what a build wrote (marker, config.json, index, shards, the base's sidecars)",
                  path=str(out), remedy=f"move them out of {out} (nothing was changed), then rerun; or choose another --out")


def remove_build_files(tree: Path, base_dir: Path | None) -> list[str]:
    """Remove from ``tree`` what a build wrote there, the marker first, then directories left empty and
    ``tree`` itself. Returns what is left (files no build writes stay, and so does ``tree`` then)."""
    files = build_files(base_dir, record_in(tree))
    dirs = _build_dirs(files)
    # The marker goes first: a tree half removed must never look complete (restore_orphaned reads it).
    with contextlib.suppress(FileNotFoundError):
        os.unlink(marker.path_in(tree))
    fsync_dir(tree)
    for rel, is_dir in list(_walk(tree)):  # children before their directory
        try:
            if is_dir and rel in dirs:
                os.rmdir(tree / rel)  # only once empty: what is left in it is not ours
            elif _accounted(rel, files):
                os.unlink(tree / rel)
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
                raise
    try:
        os.rmdir(tree)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        return unaccounted(tree, base_dir, None)
    fsync_dir(tree.parent)
    return []


def record_in(tree: Path) -> Materialized | None:
    """The marker of ``tree`` when it is readable, else None."""
    try:
        return marker.read_materialized(tree)
    except (InvalidRecord, NotFound, OSError):
        return None


# --------------------------------------------------------------------------------------------- siblings


def _sibling(out: Path, kind: str) -> Path:
    return out.with_name(tagged_name(f"{out.name}.{kind}"))


def dead_siblings(out: Path, kind: str) -> list[Path]:
    """``kind`` siblings of ``out`` whose writer is gone (this host, dead pid, or this process but idle)."""
    return dead_temporaries(out.parent, {f"{out.name}.{kind}"}, kind="dir", in_flight=building.snapshot())


def own_staged_name(out: Path) -> Path:
    return _sibling(out, "tmp")


def has_marker(tree: Path) -> bool:
    try:
        marker.read_materialized(tree)
    except (InvalidRecord, NotFound, OSError):
        return False
    return True


def restore_orphaned(out: Path) -> str | None:
    """<out> absent but a killed swap's previous tree is complete: rename it back. Returns its old path."""
    if os.path.lexists(out):
        return None
    for aside in sorted(dead_siblings(out, "previous"), key=lambda p: p.stat().st_mtime, reverse=True):
        if has_marker(aside):
            os.rename(aside, out)
            fsync_dir(out.parent)
            log.warning("restored %s from %s, left by a killed swap", out, aside)
            return str(aside)
    return None


def remove_dead_leftovers(out: Path, base_dir: Path | None, *, previous: bool) -> list[str]:
    """Remove what killed runs left beside <out> that is not the only complete tree: staged trees without
    a marker always; once <out> is complete, staged trees with one and (``previous``) previous trees (of
    these, only what a build wrote: a file someone added stays, with the tree holding it)."""
    removed = []
    complete = has_marker(out)
    for tmp in dead_siblings(out, "tmp"):
        if complete or not has_marker(tmp):
            shutil.rmtree(tmp)
            removed.append(str(tmp))
    if complete and previous:
        for aside in dead_siblings(out, "previous"):
            if not _remove_previous(aside, base_dir):
                removed.append(str(aside))
    for path in removed:
        log.info("removed %s, left by a killed materialize", path)
    return removed


def _remove_previous(aside: Path, base_dir: Path | None) -> list[str]:
    left = remove_build_files(aside, base_dir)
    if left:
        log.warning("kept %s: it holds files no build writes (%s); move them, then remove it", aside, ", ".join(left))
    return left


# --------------------------------------------------------------------------------------------- staged tree + swap


@contextlib.contextmanager
def staged_tree(out: Path) -> Iterator[Path]:
    """A fresh, process-unique directory beside ``out``; removed on exit unless it was swapped into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = _sibling(out, "tmp")
    os.mkdir(tmp)
    building.claim(tmp)
    try:
        yield tmp
    finally:
        building.unclaim(tmp)
        if os.path.lexists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)


def swap_into_place(tmp: Path, out: Path, wanted: Identity, *, replace: bool, base_dir: Path | None) -> Materialized | None:
    """Put the complete staged tree at <out>. Returns None, or the record of a concurrent build of the same
    identity that took <out> first (then ``tmp`` is left for ``staged_tree`` to remove).

    A swap checks the old tree once it is aside (no path under <out> reaches it any more): a file no build
    writes puts it back and refuses by name; the old tree's removal then deletes only what a build wrote."""
    if not replace:
        try:
            os.rename(tmp, out)  # onto an absent path or an empty directory only: never over content
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            return _taken_meanwhile(out, wanted)
        fsync_dir(out.parent)
        return None
    aside = _sibling(out, "previous")
    os.rename(out, aside)
    fsync_dir(out.parent)
    foreign = unaccounted(aside, base_dir, record_in(aside))
    if foreign:
        _put_back(aside, out)
        refuse_unaccounted(out, foreign)
    testhooks.reached("materialize:mid-swap")
    try:
        os.rename(tmp, out)
    except OSError as exc:
        try:
            os.rename(aside, out)
        except OSError:
            raise ConflictError(f"{out} was created by another process during the swap ({exc.strerror})",
                                path=str(out), remedy=f"the previous output is kept at {aside}; inspect both") from None
        raise
    fsync_dir(out.parent)
    testhooks.reached("materialize:after-swap")
    _remove_previous(aside, base_dir)
    return None


def _put_back(aside: Path, out: Path) -> None:
    try:
        os.rename(aside, out)
    except OSError as exc:
        raise ConflictError(f"{out} was created by another process during the swap ({exc.strerror})",
                            path=str(out), remedy=f"the previous output is kept at {aside}; inspect both") from None
    fsync_dir(out.parent)


def _taken_meanwhile(out: Path, wanted: Identity) -> Materialized:
    try:
        other = marker.read_materialized(out)
    except (InvalidRecord, NotFound):
        raise ConflictError(f"{out} was filled by another process while this request built",
                            path=str(out), remedy="inspect it; rerun the command to decide again") from None
    have = Identity.of(other)
    if have.differences(wanted):
        raise Refused(f"{out} was published meanwhile by another request {have.describe()}; this request is "
                      f"{wanted.describe()}", path=str(out), remedy="rerun with --force to replace it, or choose another --out")
    return other
