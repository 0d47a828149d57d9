"""Crash states beside <out>, and the recovery of the complete staged tree a killed run left behind.

What a kill leaves, and what the next request (under the lock) does with it:

* ``<out>.tmp.*`` without a marker (killed while converting): garbage of a dead run; removed by the next
  request that builds.
* ``<out>.tmp.*`` with its marker (killed after the marker, before or during the swap) while <out> is
  not complete (absent or empty): the ONLY complete tree, never deleted while it is. A request of the
  same identity without ``force`` recovers it: the tree is adopted (renamed to this run's own staged
  name), its sidecars and config.json are re-synced from the base (each file through a temporary and a
  replace, the template directory whole from a staged copy by renames, the two template files in their
  unified form under --unified-chat-template; never a shard), it gets the same verification as a fresh
  build (``verify_output``, tensor probes through the opened model.pt, the transformers loaders, every
  shard re-hashed against the marker; under --no-verify the shard sizes and the tensor count) and is
  swapped into place by rename. A failed check refuses by name and keeps
  the tree. ``force`` (or another identity) builds afresh; the dead tree goes only once <out> is complete.
* ``<out>.tmp.*`` with its marker beside a complete <out>: not the only complete tree; removed by the next
  request that builds.
* ``<out>.previous.*`` and no <out> (killed between the swap's two renames): renamed back first, under
  ``force`` too (``output.restore_orphaned``).
* ``<out>.previous.*`` otherwise: a skip leaves it; a build is refused naming it unless ``force``, which
  removes it once <out> holds the new tree (only what a build wrote).
"""

from __future__ import annotations

import contextlib
import filecmp
import logging
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from ..conversion import chat_template
from ..conversion import sidecars as hf_sidecars
from ..errors import CkptflowError, Refused
from ..fsutil import fsync_dir, tagged_name, unique_temp_path
from ..records import materialized as marker
from ..records.inventory import damaged_entry
from ..records.materialized import Materialized
from .identity import Identity
from .output import building, dead_siblings, has_marker, own_staged_name

if TYPE_CHECKING:
    from ..conversion import VerificationSummary

log = logging.getLogger("ckptflow.materialize")


def leftover_previous(out: Path) -> list[Path]:
    return dead_siblings(out, "previous")


def refuse_leftover_previous(out: Path, *, force: bool) -> None:
    """A build is refused while a killed run's previous tree is beside <out>, unless ``force``."""
    found = leftover_previous(out)
    if found and not force:
        raise Refused(f"{found[0]} is the previous output a killed materialize left beside {out}; a build "
                      "would remove it at the swap", path=str(found[0]),
                      remedy="inspect it; rerun with --force to rebuild (it is removed at the swap), or move it away")


def recoverable(out: Path, wanted: Identity) -> Path | None:
    """A killed run's complete staged tree of ``wanted`` while <out> holds no complete tree, else None."""
    if has_marker(out):
        return None
    for tmp in dead_siblings(out, "tmp"):
        try:
            record = marker.read_materialized(tmp)
        except (CkptflowError, OSError):
            continue
        if not Identity.of(record).differences(wanted):
            return tmp
    return None


def adopt(tmp: Path, out: Path) -> Path | None:
    """Rename a dead staged tree to this run's own staged name (None: another request took it first)."""
    own = own_staged_name(out)
    try:
        os.rename(tmp, own)
    except FileNotFoundError:
        return None
    building.claim(own)
    fsync_dir(out.parent)
    log.warning("adopted %s, the complete staged tree of a killed materialize, as %s", tmp, own)
    return own


def resync_sidecars(tree: Path, base_dir: Path, unified: chat_template.Unified | None = None) -> list[str]:
    """config.json and every sidecar of ``tree`` made byte-identical to the base's, each differing or
    missing file through a temporary and a replace; shards are never touched. Under --unified-chat-template
    the two template files get their unified bytes instead (``chat_template.write_unified``: a ``.writing``
    temporary and a replace). The template directory is replaced whole (``_resync_template_dir``). The
    ``.copying`` / ``.writing`` temporaries an interrupted resync or rewrite left are removed first. Returns
    what was rewritten."""
    for name in os.listdir(tree):  # an interrupted copy's or rewrite's temporary: this tree is ours now
        if name.startswith(".") and name.endswith((".copying", ".writing")) and os.path.isfile(tree / name):
            os.unlink(tree / name)
    skip = set(unified.expected()) if unified is not None else set()
    names = [n for n in (hf_sidecars.CONFIG_NAME, *hf_sidecars.list_sidecars(base_dir).files)
             if n not in skip and not n.startswith(hf_sidecars.TEMPLATE_DIR + "/")]
    rewritten = chat_template.write_unified(tree, unified) if unified is not None else []
    if _resync_template_dir(tree, base_dir):
        rewritten.append(hf_sidecars.TEMPLATE_DIR + "/")
    for rel in names:
        src, dst = base_dir / rel, tree / rel
        if os.path.isfile(dst) and not os.path.islink(dst) and filecmp.cmp(src, dst, shallow=False):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = unique_temp_path(dst, ".copying")
        try:
            shutil.copyfile(src, tmp)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, dst)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        fsync_dir(dst.parent)
        rewritten.append(rel)
    return rewritten


def _same_dir(a: Path, b: Path) -> bool:
    """Both directories (or both absent) hold the same names with the same bytes (links followed in ``a``)."""
    if not os.path.isdir(a) or not os.path.isdir(b) or os.path.islink(b):
        return not os.path.lexists(a) and not os.path.lexists(b)
    names = sorted(os.listdir(a))
    return names == sorted(os.listdir(b)) and all(
        os.path.isfile(b / n) and not os.path.islink(b / n) and filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def _resync_template_dir(tree: Path, base_dir: Path) -> bool:
    """``additional_chat_templates/`` of ``tree`` made the base's when it differs (a file missing, changed
    or extra, or the base has none): a complete copy is staged beside it under a hidden name, fsynced, and
    put in place by renames (the old directory aside, the copy in, the old one removed), never file by
    file. Hidden leftovers of an interrupted resync (this tree is private to its writer) are removed first."""
    name = hf_sidecars.TEMPLATE_DIR
    src, dst = base_dir / name, tree / name
    for stale in sorted(tree.glob(f".{name}.*")):
        _remove(stale)
    if _same_dir(src, dst):
        return False
    staged = tree / tagged_name(f".{name}", ".copying")
    if os.path.isdir(src):
        shutil.copytree(src, staged)  # links in the base are followed: the export holds regular files
        for entry in os.listdir(staged):
            with open(staged / entry, "rb+") as fh:
                os.fsync(fh.fileno())
        fsync_dir(staged)
    old = tree / tagged_name(f".{name}", ".old") if os.path.lexists(dst) else None
    if old is not None:
        os.rename(dst, old)
    if os.path.isdir(staged):
        os.rename(staged, dst)
    fsync_dir(tree)
    if old is not None:
        _remove(old)
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def check_recovered(tree: Path, base_dir: Path, record: Materialized, model_pt: Path | None, *,
                    expect_tensors: int, min_tensors: int, progress,
                    unified: chat_template.Unified | None = None) -> VerificationSummary:
    """The checks a fresh build passes before its marker; ``model_pt`` None (--no-verify): the tensor
    probes are skipped and the shards are trusted on size and tensor count instead of re-hashed. Under
    --unified-chat-template the marker's template record must be the one the base gives now."""
    from ..conversion import verify_output
    from ..conversion.verify import check_loaders

    summary = verify_output(tree, base_dir, model_pt, expect_tensors=expect_tensors, min_tensors=min_tensors,
                            verify_tensors=model_pt is not None, unified_chat_template=unified is not None)
    summary = check_loaders(tree, summary)
    wanted = unified.record() if unified is not None else None
    if record.chat_template != wanted:
        raise Refused(f"{tree}: its marker's chat_template record is not the one the base's templates give now "
                      "(--unified-chat-template)", path=str(tree))
    if summary.tensor_count != record.tensor_count:
        raise Refused(f"{tree} holds {summary.tensor_count} tensors; its marker records {record.tensor_count}",
                      path=str(tree))
    problem = damaged_entry(tree, record.shards, record="the marker", rehash=model_pt is not None)
    if problem:
        raise Refused(f"{tree}: shard {problem}", path=str(tree))
    return summary
