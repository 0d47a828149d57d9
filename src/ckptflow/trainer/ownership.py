"""Which entries of an artifact directory a trainer's save owns: its ``.save-in-progress`` record.

Before its first byte a save writes ``.save-in-progress`` (``Ownership``: its holder, then each entry it
creates with the ``lstat`` identity seen right after creating it, and again once complete) and removes it just
before committing the manifest. An interrupted save (no manifest) is discarded (``clear_interrupted``) only
when every entry in the directory is one its record names with that same identity (a file still being
written: the same inode), or a DCP-named file directly inside a DCP directory the record names; anything else
(no record, a file the record does not name, a replaced or rewritten file, a save still running on this
host) refuses the save by name and leaves every byte as it is. A save still running: its holder is another
process of this host that runs, or a save of this very process still writing that directory (``fsutil.InFlight``:
claimed by ``Ownership`` until ``Ownership.ended``): a save that failed in a training loop that goes on is
discarded by the next save of that iteration in the same process. ``write_artifact`` and the Hugging Face
callback (``begin_owned_save``) both save through it.
"""

from __future__ import annotations

import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from ..errors import CkptflowError, Refused, UnsafePath
from ..fsutil import InFlight, atomic_write_bytes, host_tag, parse_tagged_name, temp_stem, writer_gone
from ..jsonio import decode_json_object, encode_json

log = logging.getLogger(__name__)

IN_PROGRESS = ".save-in-progress"  # written first, removed last, by a save (here, in write and in checkpoints/)


def _identity(path: Path) -> dict[str, int]:
    st = os.lstat(path)
    return {"ino": st.st_ino, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns}


_SAVING = InFlight()  # the artifact directories (resolved) this process's saves are writing now


class Ownership:
    """The ``.save-in-progress`` record of one save: what it created, rewritten after each entry. The save
    calls ``ended`` once it committed or failed (the record of a failed save stays, as its proof)."""

    def __init__(self, art: Path):
        self.art = art
        self.data: dict[str, Any] = {"holder": {"host": host_tag(), "pid": os.getpid(),
                                                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                     "entries": {}}
        self._claimed = art.resolve()
        _SAVING.claim(self._claimed)
        self._write()

    def ended(self) -> None:
        _SAVING.unclaim(self._claimed)

    def _write(self) -> None:
        atomic_write_bytes(self.art / IN_PROGRESS, encode_json(self.data))

    def created(self, rel: str, *, writing: bool, dcp: bool = False) -> None:
        """Record ``rel`` (created by this save just now, exclusively); ``writing``: its bytes are still coming;
        ``dcp``: a directory the ranks' DCP writers fill (its DCP-named files are this save's)."""
        self.completed(rel, writing=writing, dcp=dcp)

    def completed(self, *rels: str, writing: bool = False, dcp: bool = False) -> None:
        """Record each of ``rels`` (as ``created``) with one rewrite of the record (one pair of fsyncs)."""
        for rel in rels:
            self.data["entries"][rel] = {**_identity(self.art / rel), "writing": writing,
                                         **({"dcp": True} if dcp else {})}
        self._write()

    def release(self) -> None:
        os.unlink(self.art / IN_PROGRESS)  # this save's own record, written by _write above


def _is_record_temp(name: str) -> bool:
    parsed = parse_tagged_name(name, ".tmp")
    return parsed is not None and parsed[0] == f".{temp_stem(IN_PROGRESS)}"


def _read_ownership(art: Path) -> dict[str, dict[str, Any]]:
    """The entries an interrupted save's record names; refuses (by name) a missing or unreadable record."""
    path = art / IN_PROGRESS
    remedy = "move your files out of the artifact directory (or seal them: ckptflow seal), then save again"
    if path.is_symlink() or not path.is_file():
        raise Refused(f"{art} has no manifest and no {IN_PROGRESS} record of this tool: nothing proves its "
                      f"entries ({', '.join(sorted(os.listdir(art))[:20])}) were written by a save", remedy=remedy)
    try:
        data = decode_json_object(path.read_bytes(), what=str(path))
        entries, holder = data["entries"], data["holder"]
        if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
            raise ValueError("entries is not an object of objects")
    except (CkptflowError, KeyError, TypeError, ValueError, OSError) as exc:
        raise Refused(f"{path} cannot be read ({exc}): nothing proves what the interrupted save wrote",
                      remedy=remedy) from exc
    if _still_running(holder, art):
        pid = holder["pid"]
        raise Refused(f"{path}: a save of {art.name} by pid {pid} on this host is still running",
                      remedy="let it finish (or stop it) before saving this iteration again")
    return entries


def _still_running(holder: Any, art: Path) -> bool:
    """Whether the save whose record ``art`` holds may still be writing: a process of this host that runs,
    other than this one; or a save of this process still writing ``art`` (this pid's record of a directory
    no save of this process is writing is a failed save's, or an earlier process's that had this pid)."""
    if not (isinstance(holder, dict) and holder.get("host") == host_tag() and isinstance(pid := holder.get("pid"), int)):
        return False
    if pid == os.getpid():
        return art.resolve() in _SAVING.snapshot()
    return not writer_gone(pid)


def clear_interrupted(art: Path) -> None:
    if art.is_symlink():
        raise UnsafePath(f"artifact directory {art} is a symlink", remedy="remove the link; the trainer writes a real directory")
    if not art.exists():
        return
    entries = _read_ownership(art)
    found = [rel for rel in walk_all(art) if rel != IN_PROGRESS and not _is_record_temp(rel)]
    foreign = []
    for rel in found:
        rec, now = entries.get(rel), _identity(art / rel)
        if rec is None and _written_by_dcp(rel, entries, art):
            continue
        if rec is None or (now["ino"] != rec.get("ino")) or (
                not rec.get("writing") and any(now[k] != rec.get(k) for k in now)):
            foreign.append(rel)
    if foreign:
        raise Refused(f"{art} holds an interrupted save (no manifest) and entries its {IN_PROGRESS} record does not "
                      f"prove were written by it (unlisted, replaced or rewritten): "
                      f"{', '.join(foreign[:20])}{' ...' if len(foreign) > 20 else ''}",
                      remedy="move those files out of the artifact directory (or seal them: ckptflow seal), then save again")
    log.warning("%s holds an interrupted save (no manifest); discarding what it wrote and writing iteration again", art)
    # Deepest first: files, then the directories this save created, then its record (all proven above).
    for rel in sorted(found, key=lambda r: r.count("/"), reverse=True):
        p = art / rel
        if p.is_dir() and not p.is_symlink():
            os.rmdir(p)  # empty now; a file written there meanwhile makes this fail rather than vanish
        else:
            os.unlink(p)
    for name in os.listdir(art):
        if _is_record_temp(name):
            os.unlink(art / name)  # a dead temporary of this save's record
    os.unlink(art / IN_PROGRESS)
    os.rmdir(art)


_DCP_NAME = re.compile(r"^(__\d+_\d+\.distcp|(__\d+)?\.metadata(\.tmp)?)$")


def _written_by_dcp(rel: str, entries: dict[str, dict[str, Any]], art: Path) -> bool:
    """A DCP-named file directly inside a DCP directory this save created (same inode): written by one of
    the save's ranks before rank 0 could record it (a rank killed between its shards and the seal)."""
    parent, _, name = rel.rpartition("/")
    rec = entries.get(parent) if parent else None
    return (bool(rec and rec.get("dcp") and rec.get("writing")) and _DCP_NAME.match(name) is not None
            and os.lstat(art / parent).st_ino == rec.get("ino") and (art / rel).is_file() and not (art / rel).is_symlink())


def begin_owned_save(art: Path) -> Ownership:
    """For a save that fills ``art`` by other means (the Hugging Face callback's hard links): discard an
    interrupted save its record proves (refusing anything else by name, as ``write_artifact`` does), create the
    directory and this save's ``.save-in-progress`` record. The caller records each entry it creates
    (``created``) and drops the record (``release``) right before committing the manifest."""
    clear_interrupted(art)
    art.mkdir(parents=True)
    return Ownership(art)


def walk_all(root: Path) -> list[str]:
    """Every entry (files and directories, not following links) under ``root``, relative, POSIX."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in (*dirnames, *filenames):
            out.append((Path(dirpath) / name).relative_to(root).as_posix())
    return sorted(out)
