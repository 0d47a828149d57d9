"""The merge in-progress marker ``.merge-in-progress.json``: which ``model.pt`` files a build may leave.

Written by merge before it removes the previous record and renames its verified temporary over
``model.pt``; removed after ``.merge-complete.json`` is written. It names, by file identity (device,
inode, size, modification time), the ``model.pt`` the build is replacing (one the merge was allowed to
replace) and the temporary that becomes the new ``model.pt``. A rerun that finds ``model.pt`` without a
merge record rebuilds only when this marker names that very file; any other record-less ``model.pt``
was not written by merge and is refused::

    {
      "files": [{"device": 2049, "inode": 131, "mtime_ns": 1700000000000000000, "size": 1234}],
      "protocol": "ckptflow.merge-in-progress.v1"
    }
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _record

FILENAME = ".merge-in-progress.json"
PROTOCOL = "ckptflow.merge-in-progress.v1"

KIND = _record.RecordKind(filename=FILENAME, schema="merge_progress", protocol=PROTOCOL)


@dataclass(frozen=True, slots=True)
class FileState(_record.Flat):
    device: int
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path | str) -> FileState:
        """The identity of the file at ``path`` itself (a symlink is not followed)."""
        st = os.stat(path, follow_symlinks=False)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True, slots=True)
class MergeProgress:
    files: tuple[FileState, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> MergeProgress:
        _record.check_object(KIND, data, what)
        files = tuple(
            FileState(*(_record.require_size(f[k], what, f"files[{i}].{k}") for k in ("device", "inode", "size", "mtime_ns")))
            for i, f in enumerate(data["files"])
        )
        return cls(files=files)

    def to_dict(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL, "files": [f.to_dict() for f in self.files]}

    def names(self, path: Path | str) -> bool:
        """Whether the file now at ``path`` is one this marker names."""
        try:
            return FileState.of(path) in self.files
        except FileNotFoundError:
            return False


_FILE = _record.RecordFile(KIND, MergeProgress)
path_in = KIND.path_in
read_merge_progress = _FILE.read
write_merge_progress = _FILE.write
