"""Snapshots of directory trees: "byte-identical" in a test compares two of these."""

from __future__ import annotations

import os
from pathlib import Path


def tree_bytes(root: Path, *, exclude: tuple[str, ...] = ()) -> dict[str, bytes | str]:
    """Every entry under ``root`` (files by content, symlinks by target, directories as "<dir>"), nothing
    followed; relative POSIX paths in ``exclude`` are left out. An absent ``root`` gives ``{}``."""
    out: dict[str, bytes | str] = {}
    if not root.exists():
        return out
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel in exclude:
            continue
        if path.is_symlink():
            out[rel] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            out[rel] = "<dir>"
        else:
            out[rel] = path.read_bytes()
    return out


def file_bytes(root: Path, *, exclude: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Every regular file under ``root`` with its bytes (directories and symlinks left out)."""
    return {k: v for k, v in tree_bytes(root, exclude=exclude).items() if isinstance(v, bytes)}


def tree_state(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` with what a rewrite would change: files by content, mtime and inode,
    directories by mtime, links by target. An absent ``root`` gives ``{}``."""
    out: dict[str, tuple] = {}
    if not os.path.lexists(root):
        return out
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        st = path.lstat()
        if path.is_symlink():
            out[rel] = ("link", os.readlink(path))
        elif path.is_dir():
            out[rel] = ("dir", st.st_mtime_ns)
        else:
            out[rel] = ("file", path.read_bytes(), st.st_mtime_ns, st.st_ino)
    return out
