"""Sidecars: checked strictly before anything is written, copied byte for byte, links followed."""

from __future__ import annotations

import os

import pytest
from conversion_helpers import copy_tree

from ckptflow.conversion.hf import convert_checkpoint
from ckptflow.conversion.sidecars import list_sidecars
from ckptflow.conversion.verify import verify_output
from ckptflow.errors import InvalidRecord, UnsafePath


def _base(tiny, tmp_path, kind="qwen2_5_vl"):
    return copy_tree(tiny.base(kind), tmp_path / "base")


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("tokenizer_config.json", b"\xef\xbb\xbf{}", "byte-order mark"),
        ("generation_config.json", b"[1, 2]", "JSON object"),
        ("preprocessor_config.json", b'{"a": NaN}', "non-finite number NaN"),
        ("chat_template.json", b'{"chat_template": "a", "chat_template": "b"}', "duplicate key"),
        ("config.json", b"\xef\xbb\xbf{}", "byte-order mark"),
        ("chat_template.jinja", b"{{ 'caf\xe9' }}", "not valid UTF-8"),
        ("additional_chat_templates/tool_use.jinja", b"\xef\xbb\xbf{{ x }}", "byte-order mark"),
    ],
)
def test_bad_sidecar_is_refused_before_anything_is_written(tiny, tmp_path, name, content, fragment):
    base = _base(tiny, tmp_path)
    (base / name).write_bytes(content)
    out = tmp_path / "out"
    with pytest.raises(InvalidRecord, match=fragment) as err:
        convert_checkpoint(tiny.checkpoint("qwen2_5_vl"), base, out)
    assert name in str(err.value)
    assert not out.exists()


def test_sidecars_are_copied_byte_for_byte_and_weights_are_not(tiny):
    base, export = tiny.base("qwen2_5_vl"), tiny.export("qwen2_5_vl")
    found = list_sidecars(base)
    assert set(found.files) == {
        "additional_chat_templates/tool_use.jinja", "chat_template.jinja", "chat_template.json",
        "generation_config.json", "preprocessor_config.json", "tokenizer.json", "tokenizer_config.json",
    }
    for rel in (*found.files, "config.json"):
        assert (export / rel).read_bytes() == (base / rel).read_bytes(), rel


def test_hf_cache_style_symlinks_are_followed_and_written_as_files(tiny, tmp_path):
    # A Hugging Face cache snapshot is a directory of links into blobs/.
    src = tiny.base("qwen3")
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshot"
    blobs.mkdir()
    snap.mkdir()
    for entry in src.iterdir():
        (blobs / entry.name).write_bytes(entry.read_bytes())
        os.symlink(blobs / entry.name, snap / entry.name)
    out = tmp_path / "out"
    convert_checkpoint(tiny.checkpoint("qwen3"), snap, out)
    assert not any(p.is_symlink() for p in out.rglob("*"))
    verify_output(out, snap, tiny.checkpoint("qwen3"), min_tensors=0)


def test_other_directories_and_hidden_files_are_not_copied(tiny, tmp_path):
    base = _base(tiny, tmp_path, "qwen3")
    (base / "original").mkdir()
    (base / "original" / "consolidated.pth").write_bytes(b"x" * 10)
    (base / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (base / "README.md").write_text("# tiny\n")
    out = tmp_path / "out"
    result = convert_checkpoint(tiny.checkpoint("qwen3"), base, out)
    assert result.ignored == ("original/",)
    assert "README.md" in result.sidecars
    assert (out / "README.md").read_text() == "# tiny\n"
    assert not (out / "original").exists() and not (out / ".gitattributes").exists()


def test_a_directory_inside_the_template_directory_is_refused(tiny, tmp_path):
    base = _base(tiny, tmp_path)
    (base / "additional_chat_templates" / "nested").mkdir()
    with pytest.raises(UnsafePath, match="not a regular file"):
        convert_checkpoint(tiny.checkpoint("qwen2_5_vl"), base, tmp_path / "out")
    assert not (tmp_path / "out").exists()
