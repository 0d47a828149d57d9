"""The two kinds of `.uploaded`: an artifact receipt (every file digest-bound) and a full-checkpoint
receipt (bulk files size-only, transactional overrides with digests), which no artifact gate accepts."""

from __future__ import annotations

import pytest
from records_samples import hexd, make_checkpoint_receipt, make_receipt

from ckptflow.errors import InvalidRecord
from ckptflow.jsonio import encode_json, validate
from ckptflow.records import LegacyRecord
from ckptflow.records.receipt import (
    FILENAME,
    CheckpointReceipt,
    NotAnArtifactReceipt,
    Receipt,
    parse_any_receipt,
    parse_receipt,
    read_any_receipt,
    read_receipt,
    write_receipt,
)


def test_both_kinds_validate_against_the_one_schema_and_read_back_as_their_kind(tmp_path):
    artifact, full = make_receipt(0), make_checkpoint_receipt(0)
    validate(artifact.to_dict(), "receipt", what="artifact receipt")
    validate(full.to_dict(), "receipt", what="full-checkpoint receipt")
    data = full.to_dict()
    assert data["kind"] == "full-checkpoint" and "kind" not in artifact.to_dict()
    assert all(set(e) == {"path", "size"} for e in data["files"])  # bulk: size only
    assert all(set(e) == {"path", "size", "sha256"} for e in data["overrides"])
    write_receipt(tmp_path, full)
    assert read_any_receipt(tmp_path) == full and isinstance(read_any_receipt(tmp_path), CheckpointReceipt)
    assert all(e.sha256 is None for e in full.files) and all(e.sha256 for e in full.overrides)
    write_receipt(tmp_path, artifact)
    assert read_any_receipt(tmp_path) == artifact and isinstance(read_any_receipt(tmp_path), Receipt)
    assert read_receipt(tmp_path) == artifact


def test_a_full_checkpoint_receipt_is_never_an_artifact_receipt(tmp_path):
    write_receipt(tmp_path, make_checkpoint_receipt(0))
    with pytest.raises(NotAnArtifactReceipt) as exc:
        read_receipt(tmp_path)
    message = str(exc.value)
    assert f"`{FILENAME}` in {tmp_path}" in message and "full-checkpoint receipt" in message
    assert "no digest" in message and "ckptflow publish" in message
    with pytest.raises(NotAnArtifactReceipt):
        parse_receipt(encode_json(make_checkpoint_receipt(0).to_dict()))
    with pytest.raises(InvalidRecord, match="is an artifact receipt, not a full-checkpoint receipt"):
        CheckpointReceipt.from_dict(make_receipt(0).to_dict())


def test_a_legacy_marker_is_neither_kind(tmp_path):
    (tmp_path / FILENAME).write_text("uploaded to s3://old-tool\n")
    with pytest.raises(LegacyRecord):
        read_any_receipt(tmp_path)
    with pytest.raises(LegacyRecord):
        read_receipt(tmp_path)


def _set(*path_and_value):
    *path, key, value = path_and_value

    def mutate(data):
        node = data
        for step in path:
            node = node[step]
        node[key] = value
    return mutate


def _drop(*path):
    def mutate(data):
        node = data
        for step in path[:-1]:
            node = node[step]
        del node[path[-1]]
    return mutate


def _append(field, entry):
    return lambda data: data[field].append(entry)


INVALID_FULL = {
    "bulk_without_size_or_digest": (_append("files", {"path": "shard.bin"}), "'size' is a required property"),
    "bulk_without_size": (_drop("files", 0, "size"), "'size' is a required property"),
    "bulk_with_a_digest": (_set("files", 0, "sha256", hexd("b")), "('sha256' was unexpected)"),
    "override_without_digest": (_drop("overrides", 0, "sha256"), "'sha256' is a required property"),
    "override_bad_digest": (_set("overrides", 0, "sha256", "ABC"), "does not match"),
    "no_overrides_field": (_drop("overrides"), "'overrides' is a required property"),
    "path_bulk_and_override": (_append("files", {"path": "progress.json", "size": 1}), "lists 'progress.json' twice"),
    "no_bulk_files": (_set("files", []), "should be non-empty"),
    "declaration_digest": (_set("declaration_sha256", hexd("a")), "'declaration_sha256' was unexpected"),
    "server_checksums": (_set("server_checksums", {}), "'server_checksums' was unexpected"),
    "other_kind": (_set("kind", "checkpoint"), "'full-checkpoint' was expected"),
    "escaping_override": (_set("overrides", 0, "path", "../latest"), "'../latest'"),
}


@pytest.mark.parametrize("case", INVALID_FULL, ids=list(INVALID_FULL))
def test_invalid_full_checkpoint_receipt_is_refused_by_name(case):
    mutate, problem = INVALID_FULL[case]
    data = make_checkpoint_receipt(0).to_dict()
    mutate(data)
    with pytest.raises(InvalidRecord) as exc:
        parse_any_receipt(encode_json(data), what="`.uploaded` in /ckpt/iter_0000300")
    assert problem in str(exc.value) and "/ckpt/iter_0000300" in str(exc.value)


@pytest.mark.parametrize("mutate, problem", [
    (lambda d: d["files"][0].pop("sha256"), "'sha256' is a required property"),
    (lambda d: d.__setitem__("overrides", []), "'overrides' was unexpected"),
    (lambda d: d.pop("declaration_sha256"), "'declaration_sha256' is a required property"),
], ids=["entry_without_digest", "overrides_field", "no_declaration_digest"])
def test_an_artifact_receipt_still_requires_every_digest(mutate, problem):
    data = make_receipt(0).to_dict()
    mutate(data)
    for parse in (parse_receipt, parse_any_receipt):
        with pytest.raises(InvalidRecord, match=problem.replace("(", r"\(").replace(")", r"\)")):
            parse(encode_json(data))


def test_an_invalid_full_checkpoint_receipt_is_never_written(tmp_path):
    from ckptflow.records.inventory import FileEntry

    good = make_checkpoint_receipt(0)
    for bad in (
        CheckpointReceipt(good.destination, (*good.files, FileEntry("x.bin", 1, hexd("a"))), good.overrides,
                          good.uploaded_at),  # a bulk entry with a digest
        CheckpointReceipt(good.destination, good.files, (FileEntry("latest", 1),), good.uploaded_at),
        CheckpointReceipt(good.destination, good.files, (FileEntry("trainer.pt", 11, hexd("a")),),
                          good.uploaded_at),  # trainer.pt is already a bulk file
    ):
        with pytest.raises(InvalidRecord):
            write_receipt(tmp_path, bad)
    assert not (tmp_path / FILENAME).exists()
