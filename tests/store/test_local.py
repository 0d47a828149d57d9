"""file:// specifics: metadata beside each object, reserved names, symlinks, and crash leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptflow.digest import FileDigest, sha256_bytes, sha256_file
from ckptflow.errors import ConflictError, NotFound, UnsafePath
from ckptflow.jsonio import encode_json
from ckptflow.store import LocalStore, open_store

DATA = b'{"schema": "declaration"}\n'


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    root = tmp_path / "archive"
    root.mkdir()
    return LocalStore(root, creator_wait_s=0.2)


def test_any_directory_inside_an_archive_opens_the_same_objects_with_their_metadata(store, tmp_path) -> None:
    src = tmp_path / "model.pt"
    src.write_bytes(os.urandom(70_000))
    digest = sha256_file(src)
    store.put_file("run/iter_5/model.pt", src, digest=digest)
    sub = open_store(f"file://{store.root}/run/iter_5")
    assert sub.head("model.pt").sha256 == digest.sha256
    assert [o.key for o in sub.list("")] == ["model.pt"]


def test_objects_sit_at_their_key_with_a_sidecar_and_no_temporaries(store, tmp_path) -> None:
    store.put_bytes_create_once("p/decl.json", DATA, sha256=sha256_bytes(DATA))
    src = tmp_path / "w.bin"
    src.write_bytes(b"weights")
    store.put_file("p/w.bin", src, digest=sha256_file(src))
    assert (store.root / "p" / "decl.json").read_bytes() == DATA
    assert sorted(os.listdir(store.root / "p" / ".ckptflow-meta")) == ["decl.json.json", "w.bin.json"]


@pytest.mark.parametrize("key", ["p/.ckptflow-meta/x.json", ".ckptflow-meta", "../outside", "/abs", "a//b"])
def test_reserved_and_escaping_keys_are_refused(store, key: str) -> None:
    with pytest.raises(UnsafePath):
        store.put_bytes_create_once(key, DATA, sha256=sha256_bytes(DATA))


def test_a_symlink_inside_the_archive_is_refused_not_followed(store, tmp_path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_bytes(b"not archived")
    (store.root / "p").mkdir()
    os.symlink(outside, store.root / "p" / "linked")
    os.symlink(outside / "secret.txt", store.root / "p" / "file-link")
    with pytest.raises(UnsafePath):
        store.get_bytes("p/linked/secret.txt")
    with pytest.raises(UnsafePath):
        store.get_bytes("p/file-link")
    with pytest.raises(UnsafePath):
        store.list("p/")


def test_writes_never_create_a_missing_archive_root(tmp_path) -> None:
    store = LocalStore(tmp_path / "not-mounted")
    with pytest.raises(NotFound, match="mount"):
        store.put_bytes_create_once("p/x", DATA, sha256=sha256_bytes(DATA))
    assert not store.root.exists()
    store.root.mkdir()  # what an operator does: the root exists once the archive is mounted
    assert store.put_bytes_create_once("p/x", DATA, sha256=sha256_bytes(DATA)) is True


def _crashed_writer_left(store: LocalStore, key: str, data: bytes) -> None:
    """The state a create-once writer killed between publishing its sidecar and linking its bytes leaves."""
    meta = store.root / key
    meta = meta.parent / ".ckptflow-meta" / f"{meta.name}.json"
    meta.parent.mkdir(parents=True)
    meta.write_bytes(encode_json({"sha256": sha256_bytes(data), "size": len(data)}))


def test_a_crashed_creator_is_completed_by_the_same_bytes(store) -> None:
    _crashed_writer_left(store, "p/decl.json", DATA)
    assert store.head("p/decl.json") is None
    assert store.put_bytes_create_once("p/decl.json", DATA, sha256=sha256_bytes(DATA)) is True
    assert store.head("p/decl.json").sha256 == sha256_bytes(DATA)


def test_a_crashed_creator_is_refused_by_name_for_other_bytes(store) -> None:
    _crashed_writer_left(store, "p/decl.json", DATA)
    other = b'{"schema": "other"}\n'
    with pytest.raises(ConflictError, match=r"\.ckptflow-meta/decl\.json\.json"):
        store.put_bytes_create_once("p/decl.json", other, sha256=sha256_bytes(other))
    assert store.head("p/decl.json") is None


def test_a_sidecar_that_does_not_match_the_file_size_is_not_trusted(store) -> None:
    store.put_bytes_create_once("p/decl.json", DATA, sha256=sha256_bytes(DATA))
    (store.root / "p" / "decl.json").write_bytes(DATA + b"appended")
    assert store.head("p/decl.json").sha256 is None


def test_delete_removes_the_object_before_its_sidecar_and_leaves_no_trace(store) -> None:
    store.put_bytes_create_once("p/decl.json", DATA, sha256=sha256_bytes(DATA))
    store.delete("p/decl.json")
    assert os.listdir(store.root / "p" / ".ckptflow-meta") == []
    assert store.list("") == []


def test_adopting_an_object_adds_its_sidecar_and_leaves_the_file_untouched(store) -> None:
    obj = store.root / "p" / "model.pt"
    obj.parent.mkdir(parents=True)
    obj.write_bytes(b"weights by hand")
    before = os.stat(obj)
    digest = sha256_file(obj)
    assert store.head("p/model.pt").sha256 is None
    info = store.adopt_object("p/model.pt", digest, etag=None)
    assert info is not None and info.sha256 == digest.sha256
    after = os.stat(obj)
    assert (after.st_ino, after.st_mtime_ns, obj.read_bytes()) == (before.st_ino, before.st_mtime_ns, b"weights by hand")


def test_an_object_whose_bytes_are_not_the_digest_or_that_has_a_sidecar_is_not_adopted(store) -> None:
    obj = store.root / "p" / "model.pt"
    obj.parent.mkdir(parents=True)
    obj.write_bytes(b"weights by hand")
    other = FileDigest(len(b"weights by hand"), sha256_bytes(b"weights by HAND"))
    assert store.adopt_object("p/model.pt", other, etag=None) is None  # bytes changed since they were read
    assert not (obj.parent / ".ckptflow-meta").exists() or not any((obj.parent / ".ckptflow-meta").iterdir())
    sidecar = obj.parent / ".ckptflow-meta" / "model.pt.json"
    sidecar.parent.mkdir(exist_ok=True)
    sidecar.write_bytes(b"torn")
    assert store.adopt_object("p/model.pt", sha256_file(obj), etag=None) is None  # never replaced here
    assert sidecar.read_bytes() == b"torn"
