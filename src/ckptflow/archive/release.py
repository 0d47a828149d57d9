"""Releasing local payloads whose remote copy is proven: the one path ``prune-verified`` and
``publish --delete-local`` share.

``prove_release`` runs every check and returns what may go; ``unlink_checked`` deletes exactly that:

1. The receipt belongs to this artifact and to the endpoint the credentials reach (``check_binding``).
2. Every payload file present is recorded by the receipt, and is hashed again through one open
   descriptor whose identity (device, inode, size, mtime) is taken before and after the hash: a file
   written while it was hashed is "changed".
3. The remote copy is proven by ``verify.check_receipt`` (declaration, size, ``sha256`` metadata and
   the recorded server checksum, or the bytes read and hashed).
4. Each file is renamed aside, its identity compared with the one hashed, and only then unlinked; a
   file that was replaced (an atomic re-save) or rewritten after its check is put back and kept. A
   file already gone (another prune of the same artifact) is reported, never counted as freed.

``freed_bytes`` is what the file system got back: the size of each removed file whose last name went. A
payload with another name (a hard link: a Trainer's ``checkpoint-N`` that an older export linked, a ``cp
-l`` copy) is removed from the artifact but its bytes stay: it is reported in ``held`` with its link count
and the other names found in the artifact's run directory (``held_entry``), and frees nothing.

An aside is named ``.<name>.<host>.<pid>.<token>.aside`` beside its file. One whose writer is gone (this
host, dead pid: a prune killed between the rename and the unlink, ``release:after-aside``) still holds
the payload's bytes: the next release hashes it like a payload against the receipt's entry of its file
and frees it once the remote copy is proven (``dead_asides``), and a restore puts it back under its own
name instead of downloading it (``put_back_asides``).
"""

from __future__ import annotations

import contextlib
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from .. import testhooks
from ..digest import default_workers, sha256_file
from ..errors import Refused, UnsafePath, VerificationFailed
from ..fsutil import dead_temporaries, parse_tagged_name, resolve_inside, temp_stem, unique_temp_path
from ..progress import ByteProgress
from ..records import manifest as manifest_record
from ..records import receipt as receipt_record
from ..store.base import ObjectStore
from .destinations import check_binding
from .verify import READ_NONE, ObjectState, check_receipt, describe_failures

FileStat = tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns: which file, in which state


def _file_stat(st: os.stat_result) -> FileStat:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class LocalChanged(Refused):
    """A local payload no longer hashes to the receipt: it was rewritten after publication (or while it was
    hashed). The copy is kept, and that is an error: its bytes are archived nowhere."""


class NotProven(VerificationFailed):
    """The remote copy does not prove every recorded object; ``states`` says which and how."""

    def __init__(self, message: str, states: list[ObjectState], **kw):
        super().__init__(message, **kw)
        self.states = states


@dataclass
class Checked:
    """Payload files hashed and proven, by the ``FileStat`` of the file that was hashed."""

    files: dict[str, FileStat] = field(default_factory=dict)
    gone: list[str] = field(default_factory=list)  # vanished before they were hashed
    asides: dict[str, str] = field(default_factory=dict)  # a dead aside in ``files`` -> the payload it holds

    @property
    def size(self) -> int:
        return sum(ident[2] for ident in self.files.values())


@dataclass
class Released:
    removed: list[str] = field(default_factory=list)
    freed_bytes: int = 0  # the sizes of the removed files whose last name went: what the file system got back
    kept: list[str] = field(default_factory=list)  # one reason per file not removed
    held: list[dict] = field(default_factory=list)  # removed, but its bytes stay under another name (``held_entry``)


def sole_name(path: Path) -> bool:
    """Whether removing ``path`` gives its bytes back: a regular file with one name (no hard link elsewhere:
    a Trainer's ``checkpoint-N`` linked by an older export, a ``cp -l`` copy)."""
    try:
        return os.lstat(path).st_nlink == 1
    except FileNotFoundError:
        return False


def held_entry(artifact_dir: Path, rel: str, st: os.stat_result) -> dict:
    """``{"file", "links", "other_names"}`` of a payload with ``st.st_nlink - 1`` other names: those found
    in the artifact's run directory (``<run>/<ts>``, where a Trainer's ``checkpoint-N`` lies), absolute; a
    name elsewhere on the file system is counted in ``links`` but not searched for."""
    target, want = (st.st_dev, st.st_ino), st.st_nlink - 1
    own = os.path.abspath(artifact_dir / rel)
    found: list[str] = []
    run_dir = artifact_dir.parent.parent
    for dirpath, dirnames, filenames in os.walk(run_dir):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            try:
                other = os.lstat(path)
            except OSError:
                continue
            if (other.st_dev, other.st_ino) == target and os.path.abspath(path) != own:
                found.append(os.path.abspath(path))
        if len(found) >= want:
            break
    return {"file": rel, "links": want, "other_names": found}


def present_payload(artifact_dir: Path, manifest: manifest_record.Manifest) -> list[str]:
    """The manifest's payload files still on disk (an earlier prune may have removed them)."""
    return [e.path for e in manifest.physical_files() if os.path.lexists(artifact_dir / e.path)]


ASIDE_SUFFIX = ".aside"


def dead_asides(artifact_dir: Path, payload: list[str]) -> dict[str, str]:
    """``{aside: payload}``: asides of ``payload`` files that a killed release left (this host, writer gone),
    relative to ``artifact_dir``; one listing per directory."""
    by_dir: dict[str, dict[str, str]] = {}
    for rel in payload:
        parent, _, name = rel.rpartition("/")
        by_dir.setdefault(parent, {})[f".{temp_stem(name)}"] = rel
    found = {}
    for parent, stems in by_dir.items():
        try:
            directory = resolve_inside(artifact_dir, parent, what="payload directory") if parent else artifact_dir
        except UnsafePath:
            continue  # a symlinked directory holds no aside of ours; the release refuses it by name
        for aside in dead_temporaries(directory, stems, ASIDE_SUFFIX):
            stem = parse_tagged_name(aside.name, ASIDE_SUFFIX)[0]  # type: ignore[index]  # listed by its stem
            found[f"{parent}/{aside.name}" if parent else aside.name] = stems[stem]
    return found


def is_aside_name(name: str) -> bool:
    """Whether ``name`` is shaped like a release's aside (of any writer, live or dead)."""
    return parse_tagged_name(name, ASIDE_SUFFIX) is not None


def put_back_asides(artifact_dir: Path, payload: list[str]) -> list[str]:
    """Give each payload file a killed release set aside its own name back (a link, never over a file
    standing there), then drop the aside name when both name one file; returns the payloads put back. An
    aside of a file that stands there as another file is left for a release to judge."""
    back = []
    for aside_rel, rel in sorted(dead_asides(artifact_dir, payload).items()):
        aside, path = artifact_dir / aside_rel, artifact_dir / rel
        try:
            os.link(aside, path)
            back.append(rel)
        except FileExistsError:
            pass
        except FileNotFoundError:  # put back by another process meanwhile
            continue
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.lstat(aside), os.lstat(path)):
                os.unlink(aside)  # a second name of the file now at its own name
    return back


def _hash_one(path: Path, bar: ByteProgress) -> tuple[FileStat, str] | None:
    """(``FileStat``, sha256) of the file at ``path``, read through one descriptor; None when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnsafePath(f"{path} cannot be opened as a regular file ({exc.strerror})",
                         remedy="artifacts hold regular files only") from None
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise UnsafePath(f"{path} is not a regular file", remedy="artifacts hold regular files only")
        digest = sha256_file(fd, on_bytes=bar.update)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if _file_stat(before) != _file_stat(after) or digest.size != after.st_size:
        return _file_stat(after), "written while it was hashed"
    return _file_stat(after), digest.sha256


def hash_bound(artifact_dir: Path, payload: list[str], receipt: receipt_record.Receipt,
               progress: bool | None, asides: dict[str, str] | None = None) -> Checked:
    """Hash ``payload`` again, bound to the files' identities; refuse any that left the receipt. An aside
    in ``payload`` (a key of ``asides``) is held to the receipt's entry of the file it was set aside from."""
    asides = asides or {}
    paths = {rel: resolve_inside(artifact_dir, rel, what=f"payload {rel}") for rel in payload}
    total = sum(os.lstat(p).st_size for p in paths.values() if os.path.lexists(p))
    with ByteProgress(total, "re-check sha256", progress) as bar:
        with ThreadPoolExecutor(max_workers=max(1, min(default_workers(), len(payload))),
                                thread_name_prefix="sha256") as pool:
            results = dict(zip(payload, pool.map(lambda rel: _hash_one(paths[rel], bar), payload), strict=True))
    checked = Checked(asides={a: p for a, p in asides.items() if a in results})
    changed = []
    for rel, got in results.items():
        if got is None:
            checked.gone.append(rel)
            continue
        ident, sha = got
        entry = receipt.entry(asides.get(rel, rel))
        if entry is None or (entry.size, entry.sha256) != (ident[2], sha):
            changed.append(rel)
        checked.files[rel] = ident
    if changed:
        raise LocalChanged(
            f"{artifact_dir}: local bytes of {changed[:5]} differ from the archived copy; nothing deleted",
            remedy="the local copy changed after publication; keep it and publish it as a new artifact",
        )
    return checked


def prove_release(artifact_dir: Path, store: ObjectStore, receipt: receipt_record.Receipt,
                  manifest: manifest_record.Manifest, *, read: str = READ_NONE,
                  progress: bool | None = None) -> Checked:
    """Every check before local payloads may go; raises (deleting nothing) when one fails."""
    check_binding(store, receipt, artifact_dir)
    payload = present_payload(artifact_dir, manifest)
    missing = [p for p in payload if receipt.entry(p) is None]
    if missing:
        raise Refused(f"{artifact_dir}: {missing[:5]} are not covered by the receipt", remedy="republish the artifact")
    asides = dead_asides(artifact_dir, [e.path for e in manifest.physical_files() if receipt.entry(e.path)])
    if not payload and not asides:
        return Checked()  # already released: nothing to prove
    checked = hash_bound(artifact_dir, payload + sorted(asides), receipt, progress, asides)
    states = check_receipt(store, receipt, read=read)
    if any(s.state != "ok" for s in states):
        raise NotProven(
            f"remote copy of {artifact_dir} not proven: {describe_failures(states)}", states,
            remedy="keep the local copy; an unverifiable object needs --read-data, a changed or missing one "
            "means the archive is damaged (republish to a new destination)",
        )
    return checked


def release_outcome(artifact_dir: Path, checked: Checked) -> tuple[int, list[dict]]:
    """What unlinking ``checked`` would give back now, read-only (a dry run's ``freed_bytes`` and ``held``):
    the sizes of the files with one name, and a ``held_entry`` for each with another."""
    freed, held = 0, []
    for rel, ident in checked.files.items():
        try:
            st = os.lstat(artifact_dir / rel)
        except FileNotFoundError:
            continue
        if st.st_nlink == 1:
            freed += ident[2]
        else:
            held.append(held_entry(artifact_dir, rel, st))
    return freed, held


def unlink_checked(artifact_dir: Path, checked: Checked) -> Released:
    """Delete exactly the files that were hashed and proven (by identity), then the directories left empty."""
    testhooks.reached("release:before-unlink")
    out = Released()
    gone = list(checked.gone)
    for rel, ident in checked.files.items():
        try:
            if rel in checked.asides:
                outcome = _unlink_dead_aside(artifact_dir, rel, ident)
            else:
                outcome = _unlink_if_same(artifact_dir, rel, ident)
        except OSError as exc:
            outcome = f"{rel} could not be deleted ({exc.strerror}); kept"
        if outcome is None:
            gone.append(rel)
        elif isinstance(outcome, os.stat_result):  # removed; its link count just before the unlink
            out.removed.append(rel)
            if outcome.st_nlink == 1:
                out.freed_bytes += ident[2]
            else:
                out.held.append(held_entry(artifact_dir, rel, outcome))
        else:
            out.kept.append(outcome)
    if gone:
        out.kept.append(f"{sorted(gone)[:5]} were already removed (by another prune of this artifact?)")
    _remove_empty_dirs(artifact_dir, out.removed)
    return out


def _unlink_if_same(artifact_dir: Path, rel: str, ident: FileStat) -> os.stat_result | str | None:
    """The file's stat just before it was removed (its link count says whether its bytes went) when ``rel``
    was still the file hashed; None when it is gone; else why it was kept."""
    path = artifact_dir / rel
    aside = unique_temp_path(path, ASIDE_SUFFIX)
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return None
    testhooks.reached("release:after-aside")
    if _file_stat(st := os.lstat(aside)) == ident:
        os.unlink(aside)
        return st
    try:  # not the file that was checked: put it back, never over a newer one
        os.link(aside, path)
    except FileExistsError:
        return f"{rel} was replaced twice after it was checked; the earlier replacement is kept as {aside}"
    os.unlink(aside)
    return f"{rel} was replaced or rewritten after it was checked; kept"


def _unlink_dead_aside(artifact_dir: Path, rel: str, ident: FileStat) -> os.stat_result | str | None:
    """Its stat just before it was removed when the dead aside ``rel`` is still the file hashed; None when it
    is gone; else why it was kept. Its writer is gone: no process renames or writes it, so no rename aside
    is needed."""
    path = artifact_dir / rel
    try:
        if _file_stat(st := os.lstat(path)) != ident:
            return f"{rel} changed after it was checked; kept"
        os.unlink(path)
    except FileNotFoundError:
        return None
    return st


def _remove_empty_dirs(artifact_dir: Path, removed: list[str]) -> None:
    dirs = sorted({p for rel in removed for p in Path(rel).parents if str(p) != "."}, key=lambda p: -len(p.parts))
    for d in dirs:
        with contextlib.suppress(OSError):  # not empty: something else lives there; leave it
            os.rmdir(artifact_dir / d)
