import hashlib
import io
import os
import threading

from ckptflow import digest
from ckptflow.progress import ByteProgress


def test_streaming_digest_equals_hashlib_across_chunk_boundaries(tmp_path):
    data = os.urandom(3 * 1024 * 1024 + 17)
    path = tmp_path / "f"
    path.write_bytes(data)
    got = digest.sha256_file(path, chunk_size=1024 * 1024)
    assert got == digest.FileDigest(size=len(data), sha256=hashlib.sha256(data).hexdigest())


def test_parallel_hash_of_many_files_is_sorted_and_byte_accurate(tmp_path):
    expected = {}
    for i in range(7):
        rel = f"d/{i}.bin" if i % 2 else f"{i}.bin"
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(1000 * (i + 1))
        (tmp_path / rel).write_bytes(data)
        expected[rel] = digest.FileDigest(len(data), hashlib.sha256(data).hexdigest())
    got = digest.hash_files(tmp_path, reversed(list(expected)), workers=3, progress=False)
    assert got == expected
    assert list(got) == sorted(expected)


def test_empty_file_digest():
    assert digest.sha256_bytes(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_progress_counts_every_byte(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(os.urandom(2_500_000))
    with ByteProgress(2_500_000, "t", enabled=False) as bar:
        digest.sha256_file(path, chunk_size=1 << 20, on_bytes=bar.update)
    assert bar.done == 2_500_000


def test_progress_is_silent_when_not_a_tty(monkeypatch, capsys):
    monkeypatch.delenv("CKPTFLOW_PROGRESS", raising=False)
    with ByteProgress(10, "quiet") as bar:
        bar.update(10)
    assert capsys.readouterr().err == ""


def test_progress_can_be_forced_on(monkeypatch, capsys):
    monkeypatch.setenv("CKPTFLOW_PROGRESS", "1")
    with ByteProgress(10, "forced") as bar:
        bar.update(10)
    assert "forced" in capsys.readouterr().err


def test_progress_total_can_grow_while_the_bar_shows(monkeypatch, capsys):
    monkeypatch.setenv("CKPTFLOW_PROGRESS", "1")
    with ByteProgress(10, "grown") as bar:
        bar.update(10)
        bar.grow(5)
        bar.update(5)
        assert (bar.total, bar.done) == (15, 15) and bar._bar.total == 15
    assert "grown" in capsys.readouterr().err


def test_hashing_writer_hashes_what_it_writes():
    buf = io.BytesIO()
    w = digest.HashingWriter(buf)
    w.write(b"abc")
    w.write(b"def")
    assert w.size == 6 and w.hexdigest() == hashlib.sha256(b"abcdef").hexdigest() and buf.getvalue() == b"abcdef"


def test_hashing_writer_hashes_large_writes_on_another_thread_before_returning_the_buffer():
    buf = io.BytesIO()
    w = digest.HashingWriter(buf)
    threads = []

    class Recording:
        def __init__(self):
            self.h = hashlib.sha256()

        def update(self, data):
            threads.append(threading.current_thread())
            self.h.update(data)

        def hexdigest(self):
            return self.h.hexdigest()

    w._h = Recording()
    big = bytearray(os.urandom(digest.OVERLAP_MIN + 17))
    expected = hashlib.sha256(b"head" + bytes(big) + b"tail").hexdigest()
    w.write(b"head")
    w.write(big)
    big[:] = bytes(len(big))  # the caller reuses its buffer as soon as write returns
    w.write(memoryview(b"tail"))
    assert w.hexdigest() == expected and w.size == len(big) + 8
    assert buf.getvalue()[4:-4] != bytes(len(big))
    assert [t is threading.current_thread() for t in threads] == [True, False, True]


def test_a_pipelined_hashing_writer_hashes_in_order_and_waits_only_for_buffers_it_may_not_keep():
    buf = io.BytesIO()
    kept = bytearray(os.urandom(digest.OVERLAP_MIN + 5))
    other = bytearray(os.urandom(digest.OVERLAP_MIN + 7))
    small = bytearray(b"small")
    w = digest.HashingWriter(buf, stable=lambda view: view.obj is kept)
    expected = hashlib.sha256(b"head" + bytes(kept) + bytes(small) + bytes(other) + b"tail").hexdigest()
    w.write(b"head")
    w.write(memoryview(kept))
    w.write(small)
    small[:] = b"XXXXX"  # a small buffer is copied: the caller may reuse it at once
    w.write(other)
    other[:] = bytes(len(other))  # a large buffer not vouched for is hashed before write returns
    w.write(memoryview(b"tail"))
    assert w.hexdigest() == expected and w.size == len(kept) + len(other) + 13
    assert w._thread is None  # stopped by hexdigest


def test_a_pipelined_hashing_writer_bounds_the_copies_waiting_for_the_hash(monkeypatch):
    monkeypatch.setattr(digest, "COPY_BACKLOG", 10)
    release = threading.Event()
    seen = []

    class Slow:
        def __init__(self):
            self.h = hashlib.sha256()

        def update(self, data):
            release.wait()
            seen.append(bytes(data))
            self.h.update(data)

        def hexdigest(self):
            return self.h.hexdigest()

    waiting = threading.Event()

    class Watched(threading.Condition):
        def wait(self, timeout=None):
            waiting.set()
            return super().wait(timeout)

    out = io.BytesIO()
    w = digest.HashingWriter(out, stable=lambda view: False)
    w._h, w._hashed = Slow(), Watched()
    w.write(b"12345678")
    second = threading.Thread(target=w.write, args=(b"abcdefgh",))
    second.start()
    waiting.wait()  # 16 bytes of copies would exceed the backlog: the second write waits for the hash
    assert out.getvalue() == b"12345678" and w._copied == 8
    release.set()
    second.join()
    assert w.hexdigest() == hashlib.sha256(b"12345678abcdefgh").hexdigest() and seen == [b"12345678", b"abcdefgh"]


def test_is_sha256_hex():
    assert digest.is_sha256_hex("a" * 64)
    assert not digest.is_sha256_hex("A" * 64)
    assert not digest.is_sha256_hex("a" * 63)
    assert not digest.is_sha256_hex(None)


def test_large_files_are_read_and_hashed_on_two_threads_with_the_same_digest(tmp_path):
    size = digest.PIPE_BUFFERS * digest.PIPE_PIECE * 3 + 12345  # well past the pipelined threshold
    data = os.urandom(size)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    counted = []
    got = digest.sha256_file(path, on_bytes=counted.append)
    assert got == digest.FileDigest(size, hashlib.sha256(data).hexdigest())
    assert sum(counted) == size


def _part_digests(data: bytes, part_size: int) -> tuple[bytes, ...]:
    return tuple(hashlib.sha256(data[i:i + part_size]).digest() for i in range(0, len(data), part_size))


def test_part_digests_come_from_the_same_pass_for_small_and_large_files(tmp_path):
    """Part boundaries fall anywhere inside the read pieces (sizes that do not divide the piece size,
    a file that ends exactly on a boundary, one below a single part); the whole-file digest is unchanged."""
    for size in (0, 1000, 5 * 1024 * 1024, 7 * 1024 * 1024 + 3, 21 * 1024 * 1024):
        data = os.urandom(size)
        path = tmp_path / f"{size}.bin"
        path.write_bytes(data)
        for part_size in (1024 * 1024, 5 * 1024 * 1024 + 7, 8 * 1024 * 1024):
            got = digest.sha256_file(path, part_size=part_size)
            assert got == digest.FileDigest(size, hashlib.sha256(data).hexdigest())
            assert got.part_size == part_size
            assert got.parts == _part_digests(data, part_size), (size, part_size)
        assert digest.sha256_file(path).parts is None


def test_hash_files_asks_for_part_digests_per_file_size(tmp_path):
    big, small = os.urandom(9 * 1024 * 1024), b"small"
    (tmp_path / "big").write_bytes(big)
    (tmp_path / "small").write_bytes(small)
    asked = []

    def part_size_for(size):
        asked.append(size)
        return 4 * 1024 * 1024 if size > 1024 else None

    got = digest.hash_files(tmp_path, ["big", "small"], progress=False, part_size_for=part_size_for)
    assert sorted(asked) == [len(small), len(big)]
    assert got["big"].parts == _part_digests(big, 4 * 1024 * 1024)
    assert got["small"].parts is None
    assert got["small"] == digest.FileDigest(len(small), hashlib.sha256(small).hexdigest())
