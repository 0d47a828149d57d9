"""The ObjectStore contract, run against every real backend: SeaweedFS (S3Store over loopback),
moto (S3Store under the in-process mock) and file:// (LocalStore on a temporary directory)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptflow.digest import FileDigest, sha256_bytes, sha256_file
from ckptflow.errors import NotFound, Refused, VerificationFailed
from ckptflow.progress import ByteProgress
from ckptflow.store import LocalStore, ObjectStore, S3Store, load_credentials
from ckptflow.store.base import (
    DEFAULT_CONCURRENCY,
    DEFAULT_MULTIPART_THRESHOLD,
    DownloadShape,
    MultipartUploads,
    ResumableUploads,
    StoreCapabilities,
)

MiB = 1024 * 1024
PART = 5 * MiB  # S3's minimum part size keeps the multipart files small


@dataclass
class Backend:
    name: str
    make: Callable[..., ObjectStore]

    @property
    def atomic_create_once(self) -> bool:
        return self.name != "moto"  # FACTS: moto's conditional writes are not atomic

    @property
    def verifies_checksums(self) -> bool:
        return self.name != "moto"  # FACTS: moto accepts a wrong ChecksumSHA256


@pytest.fixture(params=[pytest.param("seaweedfs", marks=pytest.mark.seaweedfs), "moto", "file"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    def s3(bucket: str, creds):
        def make(*, small_parts: bool = False, page_size: int = 1000) -> ObjectStore:
            sizes = {"multipart_threshold": PART, "part_size": PART} if small_parts else {}
            return S3Store(bucket, creds, list_page_size=page_size, download_range_size=MiB, **sizes)
        return make

    if request.param == "seaweedfs":
        bucket = request.getfixturevalue("seaweedfs_bucket")
        return Backend("seaweedfs", s3(bucket, load_credentials(request.getfixturevalue("seaweedfs_credentials_path"))))
    if request.param == "moto":
        target = request.getfixturevalue("moto_s3")
        return Backend("moto", s3(target.bucket, target.credentials))
    root = tmp_path / "archive"
    root.mkdir()
    return Backend("file", lambda **_: LocalStore(root, range_size=MiB))


def write_file(path: Path, size: int, seed: int = 0) -> FileDigest:
    block = hashlib.sha256(str(seed).encode()).digest() * 4096  # 128 KiB of non-repeating-per-seed bytes
    with open(path, "wb") as fh:
        left = size
        while left:
            fh.write(block[: min(left, len(block))])
            left -= min(left, len(block))
    return sha256_file(path)


def test_head_of_missing_key_is_none(backend: Backend) -> None:
    assert backend.make().head("p/absent.bin") is None


def test_create_once_first_write_wins_and_second_leaves_bytes_unchanged(backend: Backend) -> None:
    store = backend.make()
    first, second = b'{"declaration": 1}\n', b'{"declaration": 2}\n'
    assert store.put_bytes_create_once("p/.posttrain-archive.json", first, sha256=sha256_bytes(first)) is True
    assert store.put_bytes_create_once("p/.posttrain-archive.json", second, sha256=sha256_bytes(second)) is False
    assert store.get_bytes("p/.posttrain-archive.json") == first
    info = store.head("p/.posttrain-archive.json")
    assert (info.size, info.sha256) == (len(first), sha256_bytes(first))


def test_single_part_upload_round_trips_sha256_metadata(backend: Backend, tmp_path: Path) -> None:
    src = tmp_path / "small.bin"
    digest = write_file(src, 3 * MiB + 17)
    store = backend.make(small_parts=True)
    info = store.put_file("p/small.bin", src, digest=digest)
    head = store.head("p/small.bin")
    assert info == head
    assert (head.size, head.sha256) == (digest.size, digest.sha256)
    if backend.name == "seaweedfs":  # the server stored and returns the ChecksumSHA256 we sent
        assert head.checksum_sha256 == digest.sha256


def test_multipart_upload_round_trips_sha256_metadata(backend: Backend, tmp_path: Path) -> None:
    src = tmp_path / "large.bin"
    digest = write_file(src, 2 * PART + 12345)
    store = backend.make(small_parts=True)
    store.put_file("p/large.bin", src, digest=digest)
    head = store.head("p/large.bin")
    assert (head.size, head.sha256) == (digest.size, digest.sha256)
    assert head.checksum_sha256 in (None, digest.sha256)  # a composite multipart checksum is never reported
    assert store.download_file("p/large.bin", tmp_path / "back.bin") == digest
    assert (tmp_path / "back.bin").read_bytes() == src.read_bytes()


def test_empty_file_round_trips(backend: Backend, tmp_path: Path) -> None:
    src = tmp_path / "empty"
    src.write_bytes(b"")
    digest = sha256_file(src)
    store = backend.make()
    assert store.put_file("p/empty", src, digest=digest).sha256 == digest.sha256
    assert store.download_file("p/empty", tmp_path / "back") == digest


@pytest.mark.parametrize("size", [2 * PART + 12345, 3 * MiB + 17])
def test_upload_refuses_a_file_that_changed_after_hashing(backend: Backend, tmp_path: Path, size: int) -> None:
    if size < PART and not backend.verifies_checksums:
        pytest.skip("moto accepts a wrong ChecksumSHA256 on a single-part PUT (FACTS); SeaweedFS refuses it")
    src = tmp_path / "changed.bin"
    write_file(src, size, seed=1)
    stale = FileDigest(size=size, sha256=sha256_bytes(b"what was hashed before the file changed"))
    with pytest.raises(VerificationFailed):
        backend.make(small_parts=True).put_file("p/changed.bin", src, digest=stale)
    assert backend.make().head("p/changed.bin") is None


def test_download_returns_the_digest_of_the_bytes_written(backend: Backend, tmp_path: Path) -> None:
    src = tmp_path / "obj.bin"
    digest = write_file(src, 3 * MiB + 5)
    store = backend.make()
    store.put_file("p/obj.bin", src, digest=digest)
    dest = tmp_path / "dest.bin"
    assert store.download_file("p/obj.bin", dest, size=digest.size) == digest
    assert dest.read_bytes() == src.read_bytes()


@pytest.mark.parametrize("prefed", [True, False], ids=["prefed-hasher", "reread-prefix"])
def test_download_resumes_after_a_verified_prefix(backend: Backend, tmp_path: Path, prefed: bool) -> None:
    src = tmp_path / "obj.bin"
    digest = write_file(src, 3 * MiB + 5)
    store = backend.make()
    store.put_file("p/obj.bin", src, digest=digest)
    data = src.read_bytes()
    start = MiB + 3
    dest = tmp_path / "partial.bin"
    dest.write_bytes(data[:start] + b"\0stale tail past the verified prefix")
    hasher = hashlib.sha256(data[:start]) if prefed else None
    assert store.download_file("p/obj.bin", dest, start=start, hasher=hasher) == digest
    assert dest.read_bytes() == data


def test_get_bytes_returns_the_object_and_refuses_oversized_ones(backend: Backend) -> None:
    store = backend.make()
    payload = b"x" * 1000
    store.put_bytes_create_once("p/record.json", payload, sha256=sha256_bytes(payload))
    assert store.get_bytes("p/record.json") == payload
    with pytest.raises(Refused):
        store.get_bytes("p/record.json", max_bytes=999)
    with pytest.raises(NotFound):
        store.get_bytes("p/absent.json")


def test_list_returns_every_page_sorted_and_only_the_prefix(backend: Backend) -> None:
    store = backend.make(page_size=2)
    keys = [f"run/iter_1/shard-{i:02d}.bin" for i in (7, 3, 0, 5, 1, 6, 2)] + ["run/iter_1/sub/a.bin"]
    others = ["run/iter_10/x.bin", "run/iter_2/y.bin", "zzz.bin"]
    for i, key in enumerate(keys + others):
        data = f"object {i}".encode()
        store.put_bytes_create_once(key, data, sha256=sha256_bytes(data))
    listed = store.list("run/iter_1/")
    assert [o.key for o in listed] == sorted(keys)
    assert [o.size for o in listed] == [len(f"object {(keys + others).index(o.key)}".encode()) for o in listed]
    assert [o.key for o in store.list("run/iter_1")] == sorted([*keys, "run/iter_10/x.bin"])
    assert store.list("nothing/here/") == []


def test_delete_removes_the_object_and_is_idempotent(backend: Backend) -> None:
    store = backend.make()
    store.put_bytes_create_once("p/gone.json", b"{}", sha256=sha256_bytes(b"{}"))
    store.delete("p/gone.json")
    assert store.head("p/gone.json") is None
    store.delete("p/gone.json")
    assert store.put_bytes_create_once("p/gone.json", b"[]", sha256=sha256_bytes(b"[]")) is True


@pytest.mark.parametrize("size", [2 * PART + 1, 3 * MiB + 1])
def test_progress_counts_every_byte_exactly_once(backend: Backend, tmp_path: Path, size: int) -> None:
    src = tmp_path / "obj.bin"
    digest = write_file(src, size)
    store = backend.make(small_parts=True)
    up = ByteProgress(size, "upload", enabled=False)
    store.put_file("p/obj.bin", src, digest=digest, progress=up)
    down = ByteProgress(size, "download", enabled=False)
    store.download_file("p/obj.bin", tmp_path / "back.bin", progress=down)
    assert (up.done, down.done) == (size, size)


def test_concurrent_create_once_has_exactly_one_winner(backend: Backend) -> None:
    if not backend.atomic_create_once:
        pytest.skip("moto's conditional PUT is not atomic (FACTS): racing it proves nothing")
    store = backend.make()
    payloads = [f"writer {i} ".encode() * 1000 for i in range(8)]
    barrier = threading.Barrier(len(payloads))
    results: list[bool | None] = [None] * len(payloads)

    def race(i: int) -> None:
        barrier.wait()
        results[i] = store.put_bytes_create_once("p/decl.json", payloads[i], sha256=sha256_bytes(payloads[i]))

    threads = [threading.Thread(target=race, args=(i,)) for i in range(len(payloads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results.count(True) == 1 and results.count(False) == len(payloads) - 1
    winner = payloads[results.index(True)]
    assert store.get_bytes("p/decl.json") == winner
    assert store.head("p/decl.json").sha256 == sha256_bytes(winner)


def test_listing_shows_objects_only_never_temporaries_or_metadata(backend: Backend, tmp_path: Path) -> None:
    src = tmp_path / "f.bin"
    digest = write_file(src, 1000)
    store = backend.make()
    store.put_file("a/f.bin", src, digest=digest)
    store.put_bytes_create_once("a/g.json", b"{}", sha256=sha256_bytes(b"{}"))
    assert [o.key for o in store.list("")] == ["a/f.bin", "a/g.json"]
    assert [(o.key, o.size) for o in store.list("a/")] == [("a/f.bin", 1000), ("a/g.json", 2)]


class _AlmostAStore:
    """Everything but ``delete``: not an ObjectStore."""

    destination = None
    supports_checksum_sha256 = False

    def __getattr__(self, name):
        if name == "delete":
            raise AttributeError(name)
        return lambda *a, **k: None


def test_only_stores_are_object_stores(tmp_path: Path) -> None:
    from ckptflow.store.credentials import Credentials
    from ckptflow.store.gcs import GCSStore

    assert isinstance(LocalStore(tmp_path), ObjectStore)
    assert not isinstance(object(), ObjectStore)
    assert not isinstance("s3://bucket/key", ObjectStore)
    assert not isinstance(_AlmostAStore(), ObjectStore)
    gcs = GCSStore("bucket", Credentials("GOOG1ID", "secret", "http://127.0.0.1:9"))
    assert isinstance(gcs, ObjectStore)
    # No catch-all forwarding: what the protocol and the archive do not use does not exist on a GCS store.
    assert not hasattr(gcs, "put_bytes_wrong_checksum")
    assert not hasattr(gcs, "no_such_method")
    assert gcs._s3_obj is None  # and asking did not build the S3-interop client


def test_each_backend_says_its_capabilities_explicitly(backend: Backend) -> None:
    """Multipart uploads, the download shape and the concurrency are attributes of every store: present,
    or None where the backend has none, so no caller probes a store for methods."""
    store = backend.make(small_parts=True)
    assert isinstance(store, StoreCapabilities)
    assert store.concurrency == DEFAULT_CONCURRENCY
    if backend.name == "file":
        assert store.multipart is None  # every file is copied whole
        assert store.download_shape == DownloadShape(DEFAULT_CONCURRENCY, MiB)
        return
    assert store.download_shape.range_size == MiB  # given; the connections follow where the endpoint is
    assert store.multipart.threshold == PART
    assert isinstance(store.multipart.resumable, ResumableUploads)
    assert store.multipart.resumable.resumable_part_size("p/none.bin", 3 * PART) is None  # nothing journaled
    assert store.multipart.resumable.sweep_uploads("p/", older_than=3600, dry_run=True) == ([], [])
    # FACTS: SeaweedFS refuses a part under a wrong ChecksumSHA256, moto stores it.
    assert store.multipart.part_checksums_enforced("p/part-check") is (backend.name == "seaweedfs")
    assert store.head("p/part-check") is None


def test_a_gcs_store_says_its_capabilities_without_building_its_s3_client() -> None:
    from ckptflow.store.credentials import Credentials
    from ckptflow.store.gcs import GCSStore

    gcs = GCSStore("bucket", Credentials("GOOG1ID", "secret", "https://storage.example.org"),
                   multipart_threshold=PART, download_range_size=MiB)
    assert isinstance(gcs, StoreCapabilities)
    # Parts from the same threshold as S3, but nothing journaled to resume or sweep and no part checksums.
    assert gcs.multipart == MultipartUploads(PART, resumable=None, part_checksums_enforced=None)
    assert gcs.download_shape == DownloadShape(DEFAULT_CONCURRENCY, MiB)  # a remote endpoint: eight connections
    assert gcs.concurrency == DEFAULT_CONCURRENCY
    assert GCSStore("bucket", Credentials("GOOG1ID", "secret", None)).multipart.threshold == DEFAULT_MULTIPART_THRESHOLD
    assert gcs._s3_obj is None
