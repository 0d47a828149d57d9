"""The merge commit record ``.merge-complete.json``: which request produced the merged model.

Written beside the output after the merged ``model.pt`` was verified; a rerun with the same request
identity is a no-op, a different request is refused unless ``--force``::

    iter_0000300/
    ├── model.pt
    ├── merge_diag.json       optional diagnostics ("diag")
    └── .merge-complete.json  this record

    {
      "diag": "merge_diag.json",
      "outputs": [{"path": "model.pt", "sha256": "<hex>", "size": 1234}],
      "protocol": "ckptflow.merge-complete.v1",
      "request": {
        "base": {"config_sha256": "<hex>", "index_sha256": "<hex>"},
        "experts": [{"path": "/ckpt/a/model.pt", "sha256": "<hex>", "size": 1234}, ...],
        "iteration": 300, "lam": 0.5, "mode": "tv"
      },
      "tool_version": "0.1.0"
    }

Expert order is part of the identity and is kept as given. An expert's ``path`` is an identity string,
never opened from the record. Any ``tool_version`` is readable (the merge command decides what to do
with an older one); a record without a protocol, or with an older one, raises ``LegacyRecord``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..digest import sha256_bytes
from ..fsutil import safe_relpath
from ..jsonio import encode_json
from . import _record
from ._record import LegacyRecord
from .inventory import FileEntry, inventory_from_list, inventory_to_list, sorted_entries

__all__ = [
    "FILENAME",
    "PROTOCOL",
    "BaseIdentity",
    "Expert",
    "LegacyRecord",
    "MergeRecord",
    "MergeRequest",
    "encode_merge_record",
    "parse_merge_record",
    "path_in",
    "read_merge_record",
    "request_identity",
    "write_merge_record",
]

FILENAME = ".merge-complete.json"
PROTOCOL = "ckptflow.merge-complete.v1"

KIND = _record.RecordKind(
    filename=FILENAME,
    schema="merge_record",
    protocol=PROTOCOL,
    legacy_remedy="it was written by an older tool; rebuild the merge with --force",
)


@dataclass(frozen=True, slots=True)
class Expert(_record.Flat):
    path: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class BaseIdentity(_record.Flat):
    config_sha256: str
    index_sha256: str


@dataclass(frozen=True, slots=True)
class MergeRequest:
    mode: str
    experts: tuple[Expert, ...]
    base: BaseIdentity | None
    lam: float | None
    iteration: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "experts", tuple(self.experts))

    def to_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "experts": [e.to_dict() for e in self.experts],
            "base": self.base.to_dict() if self.base is not None else None,
            "lam": self.lam,
            "iteration": self.iteration,
        }

    def identity(self) -> str:
        return request_identity(self.to_dict())


@dataclass(frozen=True, slots=True)
class MergeRecord:
    tool_version: str
    request: MergeRequest
    outputs: tuple[FileEntry, ...]
    diag: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", sorted_entries(self.outputs))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> MergeRecord:
        _record.check_object(KIND, data, what)
        req = data["request"]
        experts = tuple(
            Expert(
                path=e["path"],
                size=_record.require_size(e["size"], what, f"request.experts[{i}].size"),
                sha256=_record.require_sha256(e["sha256"], what, f"request.experts[{i}].sha256"),
            )
            for i, e in enumerate(req["experts"])
        )
        base = req["base"]
        if base is not None:
            base = BaseIdentity(
                config_sha256=_record.require_sha256(
                    base["config_sha256"], what, "request.base.config_sha256"
                ),
                index_sha256=_record.require_sha256(base["index_sha256"], what, "request.base.index_sha256"),
            )
        request = MergeRequest(
            mode=req["mode"],
            experts=experts,
            base=base,
            lam=_record.require_finite(req["lam"], what, "request.lam"),
            iteration=_record.require_size(req["iteration"], what, "request.iteration"),
        )
        diag = data["diag"]
        if diag is not None:
            safe_relpath(diag, what=f"{what}: diag")
        return cls(
            tool_version=data["tool_version"],
            request=request,
            outputs=inventory_from_list(data["outputs"], what),
            diag=diag,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "tool_version": self.tool_version,
            "request": self.request.to_dict(),
            "outputs": inventory_to_list(self.outputs),
            "diag": self.diag,
        }


def request_identity(request: Mapping[str, Any]) -> str:
    """SHA-256 of the request's deterministic encoding: equal requests, equal identity."""
    return sha256_bytes(encode_json(dict(request)))


# write_merge_record is called only after the merged output was verified.
_FILE = _record.RecordFile(KIND, MergeRecord)
path_in = KIND.path_in
parse_merge_record = _FILE.parse
read_merge_record = _FILE.read
encode_merge_record = _FILE.encode
write_merge_record = _FILE.write
