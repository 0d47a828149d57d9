"""One sample of every record and how to read, write, encode and parse it (shared by the record tests)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptflow.records import (
    declaration,
    legacy_manifest,
    manifest,
    materialized,
    merge_record,
    probe,
    receipt,
    staging,
)
from ckptflow.records.inventory import FileEntry


def hexd(char: str) -> str:
    return char * 64


def entries(*names: str, digest: str = "a") -> list[FileEntry]:
    """Unsorted on purpose: records must sort inventories themselves."""
    return [FileEntry(name, 10 + i, hexd(digest)) for i, name in enumerate(reversed(names))]


DEST = {"scheme": "s3", "endpoint": "127.0.0.1:18333", "bucket": "ckpts"}


def make_manifest(v: int) -> manifest.Manifest:
    return manifest.Manifest(
        iteration=300 + v,
        components={
            "optim": manifest.DcpComponent(
                "optim", tuple(entries("__0_0.distcp", ".metadata", "__1_0.distcp"))
            ),
            "model": manifest.FileComponent("model.pt", 1234 + v),
        },
        producer=manifest.Producer(tool="trainer", version="1.0"),
    )


def make_declaration(v: int) -> declaration.Declaration:
    digest = "0123456789abcdef"[v]
    files = [*entries("model.pt", "optim/.metadata"), FileEntry(manifest.FILENAME, 512, hexd(digest))]
    return declaration.Declaration(manifest_sha256=hexd(digest), iteration=300, files=tuple(files))


def make_receipt(v: int) -> receipt.Receipt:
    return receipt.Receipt(
        destination=receipt.ReceiptDestination.at(
            probe.ProbeDestination.of(DEST), prefix="run1/iter_0000300"
        ),
        declaration_sha256=hexd("0123456789abcdef"[v]),
        files=tuple(entries("model.pt", ".posttrain-checkpoint-artifact.json", "optim/.metadata")),
        uploaded_at="2025-01-31T12:00:00Z",
    )


def make_checkpoint_receipt(v: int) -> receipt.CheckpointReceipt:
    """A full-checkpoint receipt: bulk files by size only, the files rewritten in place by digest."""
    return receipt.CheckpointReceipt(
        destination=receipt.ReceiptDestination.at(
            probe.ProbeDestination.of(DEST), prefix="run1/checkpoints/iter_0000300"
        ),
        files=tuple(FileEntry(e.path, e.size + v) for e in entries("trainer.pt", "model/__0_0.distcp")),
        overrides=tuple(entries("progress.json", "latest_checkpointed_iteration.txt", digest="0123456789abcdef"[v])),
        uploaded_at="2025-01-31T12:00:00Z",
    )


def make_merge_record(v: int) -> merge_record.MergeRecord:
    request = merge_record.MergeRequest(
        mode="tv",
        experts=(
            merge_record.Expert("/ckpt/z/model.pt", 100, hexd("c")),
            merge_record.Expert("relative/a/model.pt", 100 + v, hexd("d")),
        ),
        base=merge_record.BaseIdentity(config_sha256=hexd("e"), index_sha256=hexd("f")),
        lam=0.5,
        iteration=300,
    )
    return merge_record.MergeRecord(
        "0.1.0", request, tuple(entries("model.pt", "diag/stats.json")), "merge_diag.json"
    )


def make_staging(v: int) -> staging.StagingRecord:
    return staging.StagingRecord(
        source_uri="s3://ckpts/run1/checkpoint_artifacts/iter_0000300",
        declaration_sha256=hexd("0123456789abcdef"[v]),
        files=tuple(entries("optim/__0_0.distcp", "model.pt")),
        complete=bool(v),
    )


def make_materialized(v: int) -> materialized.Materialized:
    return materialized.Materialized(
        conversion_version=f"{v + 1}",
        source=materialized.SourceIdentity(uri=None, sha256=hexd("b"), size=1234),
        base=materialized.BaseModelIdentity(path="/models/base", config_sha256=hexd("c"), index_sha256=None),
        options={"unified_chat_template": False, "max_shard_mb": 100, "dtype": "bf16", "none": None},
        shards=tuple(entries("model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors")),
        tensor_count=291,
        chat_template=None if v == 0 else {
            "processor_template_sha256": hexd("1"), "canonical_sha256": hexd("2"), "allowed_sidecars": [],
            "files": [{"path": name, "base_sha256": hexd("3"), "sha256": hexd("4"), "diff": "@@ -1,1 +1,1 @@\n"}
                      for name in ("chat_template.json", "tokenizer_config.json")],
        },
    )


def make_probe(v: int) -> probe.ProbeRecord:
    results = probe.ProbeResults(
        create_once_refused_second_write=True,
        concurrent_creators=8,
        concurrent_winners=1,
        sha256_metadata_roundtrip=True,
        checksum_sha256=("rejected-wrong", "not-offered")[v],
        part_checksum_sha256=("enforced", None)[v],  # v1: a record from before the part check
    )
    return probe.ProbeRecord(
        probe.ProbeDestination.of(DEST), "ckptflow-probe/x", "2025-01-31T12:00:00Z", results, True
    )


@dataclass(frozen=True)
class Spec:
    name: str
    filename: str
    make: Callable[[int], Any]
    write: Callable[[Path, Any], Path]
    read: Callable[[Path], Any]
    encode: Callable[[Any], bytes]
    parse: Callable[..., Any]
    protocol_key: str = "protocol"
    inventory: tuple[str, ...] | None = None  # keys leading to the inventory list inside to_dict()

    def locate(self, directory: Path) -> Path:
        if self.name == "probe":
            return probe.probe_record_path(DEST)
        return directory / self.filename


SPECS = [
    Spec(
        "manifest",
        manifest.FILENAME,
        make_manifest,
        manifest.write_manifest,
        manifest.read_manifest,
        manifest.encode_manifest,
        manifest.parse_manifest,
        protocol_key="schema",
        inventory=("components", "optim", "files"),
    ),
    Spec(
        "declaration",
        declaration.FILENAME,
        make_declaration,
        declaration.write_declaration,
        declaration.read_declaration,
        declaration.encode_declaration,
        declaration.parse_declaration,
        inventory=("files",),
    ),
    Spec(
        "receipt",
        receipt.FILENAME,
        make_receipt,
        receipt.write_receipt,
        receipt.read_receipt,
        receipt.encode_receipt,
        receipt.parse_receipt,
        inventory=("files",),
    ),
    Spec(
        "checkpoint_receipt",
        receipt.FILENAME,
        make_checkpoint_receipt,
        receipt.write_receipt,
        receipt.read_any_receipt,
        receipt.encode_receipt,
        receipt.parse_any_receipt,
        inventory=("overrides",),
    ),
    Spec(
        "merge_record",
        merge_record.FILENAME,
        make_merge_record,
        merge_record.write_merge_record,
        merge_record.read_merge_record,
        merge_record.encode_merge_record,
        merge_record.parse_merge_record,
        inventory=("outputs",),
    ),
    Spec(
        "staging",
        staging.FILENAME,
        make_staging,
        staging.write_staging,
        staging.read_staging,
        staging.encode_staging,
        staging.parse_staging,
        inventory=("files",),
    ),
    Spec(
        "materialized",
        materialized.FILENAME,
        make_materialized,
        materialized.write_materialized,
        materialized.read_materialized,
        materialized.encode_materialized,
        materialized.parse_materialized,
        inventory=("shards",),
    ),
    Spec(
        "probe",
        "probe record",
        make_probe,
        lambda _d, rec: probe.write_probe_record(rec),
        lambda _d: probe.read_probe_record(DEST),
        probe.encode_probe_record,
        probe.parse_probe_record,
    ),
]

LEGACY_MANIFEST = Spec(
    "legacy_manifest",
    legacy_manifest.FILENAME,
    lambda v: b'{"legacy": %d}\n' % v,
    legacy_manifest.write_legacy_manifest,
    legacy_manifest.read_legacy_manifest,
    bytes,
    legacy_manifest.check_legacy_manifest,
)


def inventory_of(data: dict[str, Any], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    node: Any = data
    for key in keys:
        node = node[key]
    return node
