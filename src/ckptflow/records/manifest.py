"""The native manifest ``.posttrain-checkpoint-artifact.json``: what an artifact directory holds.

::

    iter_0000300/
    ├── model.pt                              a "file" component
    ├── optim/                                a "dcp" component (torch.distributed.checkpoint directory)
    │   ├── .metadata
    │   └── __0_0.distcp
    └── .posttrain-checkpoint-artifact.json   this record, committed last

    {
      "components": {
        "model": {"format": "file", "path": "model.pt", "sha256": "<hex>", "size": 1234},
        "optim": {"files": [{"path": ".metadata", "sha256": "<hex>", "size": 99}, ...],
                  "format": "dcp", "path": "optim"}
      },
      "iteration": 300,
      "producer": {"tool": "ckptflow", "version": "0.1.0"},
      "schema": "posttrain.checkpoint-artifact.v1"
    }

A ``file`` component's ``sha256`` is optional (trainers may not hash; the publisher fills it in);
a ``dcp`` component lists every file inside its directory with size and digest. Each component owns
its path: no component lies inside another's, and no component may take a record's file name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from ..errors import InvalidRecord
from ..fsutil import safe_relpath
from . import _record
from .inventory import FileEntry, inventory_from_list, inventory_to_list, sorted_entries, validate_inventory

FILENAME = ".posttrain-checkpoint-artifact.json"
SCHEMA = "posttrain.checkpoint-artifact.v1"
# Record files that live beside the components; a component must never be one of them.
RESERVED_NAMES = frozenset(
    {FILENAME, ".posttrain-checkpoint-artifact.legacy.json", ".posttrain-archive.json", ".uploaded"}
)

KIND = _record.RecordKind(
    filename=FILENAME,
    schema="manifest",
    protocol=SCHEMA,
    protocol_key="schema",
    legacy_remedy="it predates posttrain.checkpoint-artifact.v1; convert it to a native manifest first",
)


@dataclass(frozen=True, slots=True)
class FileComponent:
    path: str
    size: int
    sha256: str | None = None
    format: ClassVar[str] = "file"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": "file", "path": self.path, "size": self.size}
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out


@dataclass(frozen=True, slots=True)
class DcpComponent:
    path: str
    files: tuple[FileEntry, ...]
    format: ClassVar[str] = "dcp"

    def __post_init__(self) -> None:
        object.__setattr__(self, "files", sorted_entries(self.files))

    def to_dict(self) -> dict[str, Any]:
        return {"format": "dcp", "path": self.path, "files": inventory_to_list(self.files)}


Component = FileComponent | DcpComponent


@dataclass(frozen=True, slots=True)
class Producer:
    tool: str
    version: str


@dataclass(frozen=True, slots=True)
class Manifest:
    iteration: int
    components: Mapping[str, Component]
    producer: Producer | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "components", dict(sorted(self.components.items())))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> Manifest:
        _record.check_object(KIND, data, what)
        components: dict[str, Component] = {}
        for name, comp in data["components"].items():
            label = f"{what}: component {name!r}"
            if name in (".", ".."):
                raise InvalidRecord(f"{label} has a reserved name", remedy="rename the component")
            safe_relpath(comp["path"], what=f"{label} path")
            if comp["format"] == "file":
                entry = FileEntry.from_dict(comp, what=label, require_digest=False)
                components[name] = FileComponent(path=entry.path, size=entry.size, sha256=entry.sha256)
            else:
                components[name] = DcpComponent(
                    path=comp["path"], files=inventory_from_list(comp["files"], label)
                )
        producer = data.get("producer")
        manifest = cls(
            iteration=_record.require_size(data["iteration"], what, "iteration"),
            components=components,
            producer=Producer(tool=producer["tool"], version=producer["version"]) if producer else None,
        )
        _check_layout(manifest, what)
        return manifest

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "iteration": self.iteration,
            "components": {name: comp.to_dict() for name, comp in self.components.items()},
        }
        if self.producer is not None:
            out["producer"] = {"tool": self.producer.tool, "version": self.producer.version}
        return out

    def physical_files(self) -> list[FileEntry]:
        """Every file the components occupy, relative to the artifact directory, sorted by path.

        A ``file`` component without a digest yields an entry whose ``sha256`` is None.
        """
        return list(_physical_files(self, what=f"manifest of iteration {self.iteration}"))


def _physical_files(manifest: Manifest, what: str) -> tuple[FileEntry, ...]:
    entries: list[FileEntry] = []
    for comp in manifest.components.values():
        if isinstance(comp, DcpComponent):
            entries.extend(FileEntry(f"{comp.path}/{f.path}", f.size, f.sha256) for f in comp.files)
        else:
            entries.append(FileEntry(comp.path, comp.size, comp.sha256))
    return validate_inventory(entries, what, require_digest=False)


def _check_layout(manifest: Manifest, what: str) -> None:
    components = list(manifest.components.items())
    for name_a, a in components:
        for name_c, c in components:
            if name_c != name_a and (c.path == a.path or c.path.startswith(a.path + "/")):
                raise InvalidRecord(
                    f"{what}: component {name_c!r} path {c.path!r} lies inside component {name_a!r} ({a.path!r})",
                    remedy="give every component its own file or directory",
                )
    for entry in _physical_files(manifest, what):
        if entry.path in RESERVED_NAMES:
            raise InvalidRecord(
                f"{what}: component file {entry.path!r} collides with a ckptflow record name",
                remedy="rename the component's file",
            )


# The caller of write_manifest commits the manifest only after every component is in place.
_FILE = _record.RecordFile(KIND, Manifest, parse_what=f"remote {FILENAME}")
path_in = KIND.path_in
parse_manifest = _FILE.parse
read_manifest = _FILE.read
encode_manifest = _FILE.encode
write_manifest = _FILE.write
