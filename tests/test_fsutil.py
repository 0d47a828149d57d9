import os

import pytest

from ckptflow import fsutil
from ckptflow.errors import NotFound, UnsafePath


def test_atomic_write_replaces_whole_file(tmp_path):
    target = tmp_path / "record.json"
    target.write_bytes(b"old")
    fsutil.atomic_write_bytes(target, b"new content")
    assert target.read_bytes() == b"new content"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_failed_atomic_write_keeps_old_bytes_and_removes_temp(tmp_path, monkeypatch):
    target = tmp_path / "record.json"
    target.write_bytes(b"old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        fsutil.atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


def test_create_exclusive_has_one_winner_and_keeps_first_bytes(tmp_path):
    target = tmp_path / "decl.json"
    assert fsutil.create_exclusive_bytes(target, b"first") is True
    assert fsutil.create_exclusive_bytes(target, b"second") is False
    assert target.read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["decl.json"]


def test_unique_temp_names_differ_between_calls(tmp_path):
    a = fsutil.unique_temp_path(tmp_path / "x")
    b = fsutil.unique_temp_path(tmp_path / "x")
    assert a != b and a.parent == tmp_path and str(os.getpid()) in a.name


@pytest.mark.parametrize(
    "bad",
    ["", "../x", "a/../b", "/etc/passwd", "a\\b", "a\x00b", "./a", "a//b", "a/", "C:/x", "."],
)
def test_unsafe_relative_paths_are_refused(bad):
    with pytest.raises(UnsafePath):
        fsutil.safe_relpath(bad)


@pytest.mark.parametrize("good", ["model.pt", "optim/__0_0.distcp", "optim/.metadata", "a/b/c.bin"])
def test_safe_relative_paths_are_accepted(good):
    assert fsutil.safe_relpath(good).as_posix() == good


def test_walk_lists_regular_files_sorted(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2").write_bytes(b"")
    (tmp_path / "b" / "1").write_bytes(b"")
    (tmp_path / "a.pt").write_bytes(b"")
    assert list(fsutil.walk_files(tmp_path)) == ["a.pt", "b/1", "b/2"]


def test_walk_refuses_a_symlink_by_name(tmp_path):
    (tmp_path / "real").write_bytes(b"x")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "link").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePath, match="link"):
        list(fsutil.walk_files(tmp_path))


def test_walk_of_missing_directory_names_it(tmp_path):
    with pytest.raises(NotFound, match="nope"):
        list(fsutil.walk_files(tmp_path / "nope"))


def test_resolve_inside_refuses_symlinked_component(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    art = tmp_path / "art"
    art.mkdir()
    (art / "optim").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePath, match="symlink"):
        fsutil.resolve_inside(art, "optim/x")
