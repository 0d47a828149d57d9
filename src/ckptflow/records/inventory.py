"""File inventories: the ``[{path, size, sha256}, ...]`` list every record uses to name files.

An inventory is sorted by path (so its encoding, and therefore its digest, is a stable identity),
holds each path once, names every file by a safe relative POSIX path, and never lists a path that is
both a file and a directory of another entry (``a`` and ``a/b``): such a tree cannot exist on disk.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..digest import sha256_file
from ..errors import InvalidRecord
from ..fsutil import safe_relpath
from ._record import optional_sha256, require_sha256, require_size


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file: path relative to the record's directory, size in bytes, lowercase hex SHA-256.

    ``sha256`` is None only where a record allows it (a trainer manifest's ``file`` component before
    the publisher fills it in); every stored inventory requires it.
    """

    path: str
    size: int
    sha256: str | None = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str, require_digest: bool = True) -> FileEntry:
        path = data.get("path")
        safe_relpath(path, what=f"{what}: path")
        size = require_size(data.get("size"), what, f"size of {path!r}")
        if require_digest:
            sha256 = require_sha256(data.get("sha256"), what, f"sha256 of {path!r}")
        else:
            sha256 = optional_sha256(data.get("sha256"), what, f"sha256 of {path!r}")
        return cls(path=path, size=size, sha256=sha256)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.path, "size": self.size}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out


def validate_inventory(
    entries: Iterable[FileEntry], what: str, *, require_digest: bool = True
) -> tuple[FileEntry, ...]:
    """Return ``entries`` sorted by path after checking every path, size and digest.

    Refuses a duplicate path and a path that is also a directory of another entry, naming both.
    """
    checked = [FileEntry.from_dict(e.to_dict(), what=what, require_digest=require_digest) for e in entries]
    ordered = sorted_entries(checked)
    paths: set[str] = set()
    for entry in ordered:
        if entry.path in paths:
            raise InvalidRecord(
                f"{what} lists {entry.path!r} twice", remedy="the record is corrupt; regenerate it"
            )
        paths.add(entry.path)
    for entry in ordered:
        for parent in PurePosixPath(entry.path).parents:
            if parent.as_posix() in paths:
                raise InvalidRecord(
                    f"{what} lists {parent.as_posix()!r} as a file and as the directory of {entry.path!r}",
                    remedy="the record is corrupt; regenerate it",
                )
    return ordered


def inventory_from_list(
    items: Iterable[Mapping[str, Any]], what: str, *, require_digest: bool = True
) -> tuple[FileEntry, ...]:
    entries = [FileEntry.from_dict(item, what=what, require_digest=require_digest) for item in items]
    return validate_inventory(entries, what, require_digest=require_digest)


def inventory_to_list(entries: Iterable[FileEntry]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in sorted_entries(entries)]


def sorted_entries(entries: Iterable[FileEntry]) -> tuple[FileEntry, ...]:
    """What record dataclasses store: an immutable tuple sorted by path (no checks; see validate_inventory)."""
    return tuple(sorted(entries, key=lambda e: e.path))


def damaged_entry(root: Path, entries: Iterable[FileEntry], *, record: str, rehash: bool) -> str | None:
    """Why the files ``entries`` list under ``root`` are not the recorded ones, or None when all are.

    Each must be a regular file (not a symlink) of the recorded size and, with ``rehash``, re-hash to
    the recorded sha256; the first that is not is named, with what ``record`` (e.g. "the record") says.
    """
    for entry in entries:
        path = root / entry.path
        if path.is_symlink() or not path.is_file():
            return f"{entry.path} is missing"
        size = path.stat().st_size
        if size != entry.size:
            return f"{entry.path} has {size} bytes, {record} says {entry.size}"
        if rehash and sha256_file(path).sha256 != entry.sha256:
            return f"{entry.path} bytes differ from {record}"
    return None
