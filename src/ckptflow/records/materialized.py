"""The materialize record ``.materialized``: the commit record of a built HF model directory.

``.materialized`` is written inside the staged tree before it is swapped into place, so a directory
that has one is complete; its identity (conversion version, source digest, base identity, options)
decides whether a rerun may reuse it::

    teacher/
    ├── config.json, tokenizer files ...
    ├── model-00001-of-00002.safetensors
    ├── model.safetensors.index.json
    └── .materialized      this record

    {
      "base": {"config_sha256": "<hex>", "index_sha256": "<hex or null>", "path": "/models/base"},
      "conversion_version": "1",
      "options": {"max_shard_bytes": 5000000000},
      "protocol": "ckptflow.materialized.v1",
      "shards": [{"path": "model-00001-of-00002.safetensors", "sha256": "<hex>", "size": 1234}, ...],
      "source": {"sha256": "<hex of model.pt>", "size": 1234, "uri": "s3://... or null"},
      "tensor_count": 291
    }

Under ``--unified-chat-template`` the options hold ``"unified_chat_template": true`` and the record a
``chat_template`` object (``conversion.chat_template.Unified.record``): the processor template's and its
canonical form's sha256, for ``chat_template.json`` and ``tokenizer_config.json`` the base's sha256, the
shipped sha256 and the one-hunk diff, and the loader-preferred sidecars allowed because they equal the
canonical template.

There is no record of a build from an intermediate HF output: every source is a ``model.pt`` (local or
archived), identified by its digest in ``source``, or a Hugging Face Trainer artifact
(``materialize.hf_source``): then ``source`` is the sha256 of the sorted inventory of the files the teacher
reads and their total size, ``options`` holds ``trainer_artifact`` (``full`` or ``lora``), and ``shards`` lists
every file of the teacher (weights, config, tokenizer and template files), the inventory its skip check reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidRecord
from . import _record
from .inventory import FileEntry, inventory_from_list, inventory_to_list, sorted_entries

FILENAME = ".materialized"
PROTOCOL = "ckptflow.materialized.v1"

KIND = _record.RecordKind(
    filename=FILENAME, schema="materialized", protocol=PROTOCOL, precheck=_record.check_source_uri
)


@dataclass(frozen=True, slots=True)
class SourceIdentity(_record.Flat):
    uri: str | None
    sha256: str
    size: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str) -> SourceIdentity:
        return cls(
            uri=data["uri"],
            sha256=_record.require_sha256(data["sha256"], what, "source.sha256"),
            size=_record.require_size(data["size"], what, "source.size"),
        )


@dataclass(frozen=True, slots=True)
class BaseModelIdentity(_record.Flat):
    path: str
    config_sha256: str
    index_sha256: str | None


@dataclass(frozen=True, slots=True)
class Materialized:
    conversion_version: str
    source: SourceIdentity
    base: BaseModelIdentity
    options: Mapping[str, bool | int | str | None]
    shards: tuple[FileEntry, ...]
    tensor_count: int
    # --unified-chat-template only: the processor template's sha256, each rewritten file's base and shipped
    # sha256 and its one-hunk diff, the loader-preferred sidecars allowed because they equal the template
    chat_template: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shards", sorted_entries(self.shards))
        object.__setattr__(self, "options", dict(sorted(self.options.items())))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = FILENAME) -> Materialized:
        _record.check_object(KIND, data, what)
        base = data["base"]
        for key, value in data["options"].items():
            if isinstance(value, float):  # the schema's "integer" also admits 1.0
                raise InvalidRecord(
                    f"{what}: options.{key} {value!r} is a float; options hold bool, int, str or null"
                )
        return cls(
            conversion_version=data["conversion_version"],
            source=SourceIdentity.from_dict(data["source"], what=what),
            base=BaseModelIdentity(
                path=base["path"],
                config_sha256=_record.require_sha256(base["config_sha256"], what, "base.config_sha256"),
                index_sha256=_record.optional_sha256(base["index_sha256"], what, "base.index_sha256"),
            ),
            options=dict(data["options"]),
            shards=inventory_from_list(data["shards"], what),
            tensor_count=_record.require_size(data["tensor_count"], what, "tensor_count"),
            chat_template=data.get("chat_template"),
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "protocol": PROTOCOL,
            "conversion_version": self.conversion_version,
            "source": self.source.to_dict(),
            "base": self.base.to_dict(),
            "options": dict(self.options),
            "shards": inventory_to_list(self.shards),
            "tensor_count": self.tensor_count,
        }
        if self.chat_template is not None:
            out["chat_template"] = self.chat_template
        return out


# write_materialized writes inside the staged tree, before the tree is swapped into place.
_FILE = _record.RecordFile(KIND, Materialized)
path_in = KIND.path_in
parse_materialized = _FILE.parse
read_materialized = _FILE.read
encode_materialized = _FILE.encode
write_materialized = _FILE.write
