"""The identity of a materialize output: what decides whether an existing <out> may be reused.

Identity = conversion version + source sha256/size + base config/index sha256 + identity options
(``run.MaterializeRequest.options``). The source URI and the base path are recorded in ``.materialized``
but are not identity: the same bytes built from another path or archive are the same teacher.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..conversion import shards as hf_shards
from ..conversion import sidecars as hf_sidecars
from ..digest import sha256_bytes, sha256_file
from ..errors import NotFound, VerificationFailed
from ..records.materialized import BaseModelIdentity, Materialized, SourceIdentity


@dataclass(frozen=True)
class Identity:
    """What decides whether an existing output may be reused (``base.path`` and ``source.uri`` are not part of it)."""

    conversion_version: str
    source: SourceIdentity
    base: BaseModelIdentity
    options: dict[str, Any]

    @classmethod
    def of(cls, record: Materialized) -> Identity:
        return cls(record.conversion_version, record.source, record.base, dict(record.options))

    def describe(self) -> str:
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        index = self.base.index_sha256[:12] if self.base.index_sha256 else "none"
        where = f" from {self.source.uri}" if self.source.uri else ""
        return (f"[source sha256 {self.source.sha256[:12]} ({self.source.size} bytes{where}), base {self.base.path} "
                f"(config {self.base.config_sha256[:12]}, index {index}), options {{{opts}}}, "
                f"conversion {self.conversion_version}]")

    def differences(self, other: Identity) -> list[str]:
        diffs = []
        if self.conversion_version != other.conversion_version:
            diffs.append(f"conversion version {self.conversion_version} -> {other.conversion_version}")
        if (self.source.sha256, self.source.size) != (other.source.sha256, other.source.size):
            diffs.append("source model.pt" if not self.source_is_trainer() else "source files")
        if self.base.config_sha256 != other.base.config_sha256:
            diffs.append("base config.json")
        if self.base.index_sha256 != other.base.index_sha256:
            diffs.append("base weight index")
        for name in sorted(set(self.options) | set(other.options)):
            if self.options.get(name) != other.options.get(name):
                diffs.append(f"option {name} {self.options.get(name)} -> {other.options.get(name)}")
        return diffs

    def source_is_trainer(self) -> bool:
        """Built from a Hugging Face Trainer artifact (``hf_artifact``: its files, not a model.pt)."""
        return "trainer_artifact" in self.options

    def to_dict(self) -> dict[str, Any]:
        return {"conversion_version": self.conversion_version, "source": self.source.to_dict(),
                "base": self.base.to_dict(), "options": dict(self.options)}


def base_identity(base_dir: Path) -> BaseModelIdentity:
    """Digests of the base's config.json and weight index (a lone ``model.safetensors``: its header)."""
    config = base_dir / hf_sidecars.CONFIG_NAME
    if not config.is_file():
        raise NotFound(f"base {base_dir} has no {hf_sidecars.CONFIG_NAME}", path=str(config),
                       remedy="point --base at a Hugging Face model directory")
    index = base_dir / hf_shards.INDEX_NAME
    if index.is_file():
        index_sha = sha256_file(index).sha256
    elif (base_dir / hf_shards.SINGLE_NAME).is_file():
        index_sha = sha256_bytes(_header_bytes(base_dir / hf_shards.SINGLE_NAME))
    else:
        raise NotFound(f"base {base_dir} has neither {hf_shards.INDEX_NAME} nor {hf_shards.SINGLE_NAME}",
                       path=str(base_dir), remedy="point --base at a Hugging Face model directory with safetensors weights")
    return BaseModelIdentity(str(base_dir), sha256_file(config).sha256, index_sha)


def _header_bytes(path: Path) -> bytes:
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        n = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
        if not 0 <= n <= hf_shards.MAX_HEADER_BYTES:
            raise VerificationFailed(f"base shard {path} has no valid safetensors header", path=str(path),
                                     remedy="fix or re-download the base")
        return prefix + fh.read(n)
