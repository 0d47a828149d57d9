import os
import subprocess

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


def _exited_pid() -> int:
    """The pid of a real process that has exited (and been reaped)."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_this_process_is_never_a_gone_writer():
    assert fsutil.writer_gone(os.getpid()) is False
    assert fsutil.writer_gone(_exited_pid()) is True


def test_temporary_names_carry_host_and_pid_and_parse_back(tmp_path):
    tmp = fsutil.unique_temp_path(tmp_path / "model.pt", ".part")
    assert fsutil.parse_tagged_name(tmp.name, ".part") == (".model.pt", fsutil.host_tag(), os.getpid())
    assert fsutil.parse_tagged_name(tmp.name, ".tmp") is None
    assert fsutil.parse_tagged_name("model.pt", ".part") is None
    sibling = fsutil.tagged_name("teacher.tmp")
    assert fsutil.parse_tagged_name(sibling) == ("teacher.tmp", fsutil.host_tag(), os.getpid())


def test_dead_temporaries_are_this_hosts_of_gone_writers_only(tmp_path):
    host = fsutil.host_tag()
    gone = _exited_pid()
    dead = tmp_path / f".model.pt.{host}.{gone}.0123abcd.tmp"
    own = fsutil.unique_temp_path(tmp_path / "model.pt")
    other_host = tmp_path / f".model.pt.{host}x.{gone}.0123abcd.tmp"
    other_name = tmp_path / f".other.pt.{host}.{gone}.0123abcd.tmp"
    for path in (dead, own, other_host, other_name):
        path.write_bytes(b"x")
    (tmp_path / f".model.pt.{host}.{gone}.4567abcd.tmp").symlink_to(dead)
    (tmp_path / f".model.pt.{host}.{gone}.89abcdef.tmp").mkdir()
    assert fsutil.dead_temporaries(tmp_path, {".model.pt"}, ".tmp") == [dead]
    assert fsutil.dead_temporaries(tmp_path, {".model.pt"}, ".tmp", kind="dir") == [
        tmp_path / f".model.pt.{host}.{gone}.89abcdef.tmp"]
    assert fsutil.dead_temporaries(tmp_path / "absent", {".model.pt"}, ".tmp") == []


def test_own_temporaries_are_dead_only_when_a_registry_proves_them_idle(tmp_path):
    own = fsutil.unique_temp_path(tmp_path / "model.pt")
    own.write_bytes(b"in flight")
    assert fsutil.dead_temporaries(tmp_path, {".model.pt"}, ".tmp") == []
    assert fsutil.dead_temporaries(tmp_path, {".model.pt"}, ".tmp", in_flight={own}) == []
    assert fsutil.dead_temporaries(tmp_path, {".model.pt"}, ".tmp", in_flight=set()) == [own]


def test_temporaries_claimed_by_any_thread_are_in_flight_until_unclaimed(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    registry = fsutil.InFlight()
    parts = [fsutil.unique_temp_path(tmp_path / f"shard-{i}", ".part") for i in range(64)]

    def write(part):
        part.write_bytes(b"x")
        registry.claim(part)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(write, parts))
    stems = {f".shard-{i}" for i in range(64)}
    assert registry.snapshot() == frozenset(parts)
    assert fsutil.dead_temporaries(tmp_path, stems, ".part", in_flight=registry.snapshot()) == []
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(registry.unclaim, parts[::2]))
    assert fsutil.dead_temporaries(tmp_path, stems, ".part", in_flight=registry.snapshot()) == sorted(parts[::2])
