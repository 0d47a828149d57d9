"""An artifact's size, one definition for every verb: the bytes of its *payload files*.

The payload files are what the artifact's manifest records (what ``seal`` commits, ``publish`` uploads,
``prune-verified`` frees, ``restore`` and ``fetch`` bring back). ckptflow's own records beside them (the
manifest, the declaration, the part digests, a legacy manifest's original) are not part of the size: they
are counted as records, and the archive's *objects* are payload files and records together. So ``seal``,
``publish``, ``status`` (local and archived) and ``ls`` print the same bytes for the same artifact::

    declaration "files": [manifest 1.1 KiB, model.pt 300 KiB, optim/__0_0.distcp 43 KiB]
    payload bytes = 343 KiB     records: manifest, declaration, part digests     objects: 6, 345 KiB
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .declaration import FILENAME as DECLARATION_FILENAME
from .inventory import FileEntry
from .legacy_manifest import FILENAME as LEGACY_MANIFEST_FILENAME
from .manifest import FILENAME as MANIFEST_FILENAME
from .part_digests import FILENAME as PART_DIGESTS_FILENAME

RECORD_NAMES = frozenset({MANIFEST_FILENAME, DECLARATION_FILENAME, PART_DIGESTS_FILENAME, LEGACY_MANIFEST_FILENAME})


def is_record(path: str) -> bool:
    """The path (relative to the artifact) is one of ckptflow's records, not a payload file."""
    return path in RECORD_NAMES


def payload_sizes(entries: Iterable[FileEntry | Mapping[str, Any]]) -> list[int]:
    """The sizes of the payload files among ``entries`` (records' ``FileEntry`` or reports' ``{"path", "size"}``)."""
    sizes = []
    for entry in entries:
        path, size = (entry.path, entry.size) if isinstance(entry, FileEntry) else (entry["path"], entry["size"])
        if not is_record(path):
            sizes.append(int(size))
    return sizes


def payload_bytes(entries: Iterable[FileEntry | Mapping[str, Any]]) -> int:
    """The artifact's size: the bytes of its payload files among ``entries``."""
    return sum(payload_sizes(entries))
