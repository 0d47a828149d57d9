"""The native manifest: component layout rules and the physical file list other steps hash and upload."""

from __future__ import annotations

import pytest
from records_samples import hexd, make_manifest

from ckptflow.errors import InvalidRecord, UnsafePath
from ckptflow.jsonio import encode_json
from ckptflow.records import LegacyRecord
from ckptflow.records.inventory import FileEntry
from ckptflow.records.manifest import (
    SCHEMA,
    DcpComponent,
    FileComponent,
    Manifest,
    parse_manifest,
    path_in,
    read_manifest,
    write_manifest,
)


def _manifest_bytes(components: dict) -> bytes:
    return encode_json({"schema": SCHEMA, "iteration": 1, "components": components})


def _file(path: str, **extra) -> dict:
    return {"format": "file", "path": path, "size": 1, **extra}


def _dcp(path: str, *files: str) -> dict:
    return {
        "format": "dcp",
        "path": path,
        "files": [{"path": f, "size": 1, "sha256": hexd("a")} for f in files],
    }


def test_physical_files_lists_every_file_relative_to_the_artifact_sorted():
    assert [e.path for e in make_manifest(0).physical_files()] == [
        "model.pt",
        "optim/.metadata",
        "optim/__0_0.distcp",
        "optim/__1_0.distcp",
    ]


def test_file_component_digest_is_optional_and_kept_when_present(tmp_path):
    without = make_manifest(0)
    assert without.components["model"].sha256 is None
    assert without.physical_files()[0] == FileEntry("model.pt", 1234, None)
    with_digest = Manifest(1, {"model": FileComponent("model.pt", 5, hexd("b"))})
    write_manifest(tmp_path, with_digest)
    assert read_manifest(path_in(tmp_path)).components["model"].sha256 == hexd("b")


def test_components_are_keyed_by_name_in_sorted_order():
    manifest = Manifest(1, {"z": FileComponent("z.pt", 1), "a": FileComponent("a.pt", 1)})
    assert list(manifest.components) == ["a", "z"]
    assert list(manifest.to_dict()["components"]) == ["a", "z"]


@pytest.mark.parametrize(
    ("components", "problem"),
    [
        ({"a": _file("x.pt"), "b": _file("x.pt")}, "lies inside component"),
        ({"a": _dcp("d", "f"), "b": _dcp("d", "g")}, "lies inside component"),
        ({"a": _dcp("d", "f"), "b": _file("d/extra.pt")}, "lies inside component"),
        ({"a": _file("d"), "b": _dcp("d/sub", "f")}, "lies inside component"),
        ({"a": _dcp("d", "f", "f/g")}, "as a file and as the directory of"),
        ({"a": _dcp("d", "f", "f")}, "twice"),
        ({"a": _file(".uploaded")}, "collides with a ckptflow record name"),
        ({"a": _file(".posttrain-checkpoint-artifact.json")}, "collides with a ckptflow record name"),
        ({"..": _file("x.pt")}, "reserved name"),
        ({"a/b": _file("x.pt")}, "does not match"),
        ({"": _file("x.pt")}, "does not match"),
        ({}, "should be non-empty"),
        ({"a": {"format": "dcp", "path": "d", "files": []}}, "should be non-empty"),
        ({"a": {"format": "zip", "path": "d"}}, "is not one of ['file', 'dcp']"),
        ({"a": _file("x.pt", files=[])}, "'files' was unexpected"),
    ],
    ids=[
        "two_files_one_path",
        "two_dcp_one_dir",
        "file_inside_dcp_dir",
        "dcp_inside_file",
        "dcp_file_and_dir",
        "dcp_duplicate_file",
        "reserved_receipt_name",
        "reserved_manifest_name",
        "dotdot_name",
        "slash_in_name",
        "empty_name",
        "no_components",
        "empty_dcp",
        "unknown_format",
        "file_with_dcp_fields",
    ],
)
def test_bad_component_layout_is_refused_by_name(components, problem):
    with pytest.raises(InvalidRecord) as info:
        parse_manifest(_manifest_bytes(components))
    assert problem in str(info.value) and ".posttrain-checkpoint-artifact.json" in str(info.value)


@pytest.mark.parametrize("bad", ["../model.pt", "/abs/model.pt", "a\\b", "a\x00b"])
@pytest.mark.parametrize("shape", ["file", "dcp_dir", "dcp_file"])
def test_unsafe_component_path_is_refused(bad, shape):
    components = {
        "file": {"a": _file(bad)},
        "dcp_dir": {"a": _dcp(bad, "f")},
        "dcp_file": {"a": _dcp("d", bad)},
    }[shape]
    with pytest.raises(UnsafePath, match=r"component 'a'"):
        parse_manifest(_manifest_bytes(components))


def test_physical_files_of_an_unchecked_manifest_refuse_conflicts():
    manifest = Manifest(
        1, {"a": FileComponent("d", 1), "b": DcpComponent("d", (FileEntry("f", 1, hexd("a")),))}
    )
    with pytest.raises(InvalidRecord, match=r"'d' as a file and as the directory of 'd/f'"):
        manifest.physical_files()


def test_manifest_without_schema_field_is_legacy():
    with pytest.raises(LegacyRecord, match=r"no 'schema' field.*convert it"):
        parse_manifest(encode_json({"iteration": 1, "model": "model.pt"}))
