"""The in-order pipeline under both transfer directions: order, bounded memory, failure, short sources."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
import time
from pathlib import Path

import pytest

from ckptflow.errors import UnsafePath, VerificationFailed
from ckptflow.store.transfer import (
    PartedFile,
    RangedFile,
    TransientRead,
    download_batch,
    download_ranges,
    part_size_for,
    upload_batch,
)
from ckptflow.store.transfer.stream import MAX_PARTS, BufferCache, MiB, ordered_map, split_ranges


def test_results_are_consumed_in_order_even_when_later_items_finish_first() -> None:
    consumed: list[int] = []
    ordered_map(list(range(12)), lambda i: (time.sleep(0.002 * (12 - i)), i)[1],
                lambda item, result: consumed.append(result), concurrency=4)
    assert consumed == list(range(12))


def test_at_most_concurrency_run_and_twice_that_are_held_at_once() -> None:
    lock = threading.Lock()
    held = peak = running = peak_running = 0

    def work(i: int) -> int:
        nonlocal held, peak, running, peak_running
        with lock:
            held += 1
            running += 1
            peak = max(peak, held)
            peak_running = max(peak_running, running)
        if i % 5 == 0:
            time.sleep(0.01)  # a slow head makes the others wait in memory
        with lock:
            running -= 1
        return i

    def consume(item: int, result: int) -> None:
        nonlocal held
        with lock:
            held -= 1

    ordered_map(list(range(40)), work, consume, concurrency=3)
    assert peak_running <= 3
    assert 3 < peak <= 6  # the slack is used while the slow head blocks the consumer


def test_the_first_failure_stops_the_pipeline_and_propagates() -> None:
    started: list[int] = []

    def work(i: int) -> int:
        started.append(i)
        if i == 2:
            raise OSError("range 2 failed")
        return i

    with pytest.raises(OSError, match="range 2 failed"):
        ordered_map(list(range(100)), work, lambda *_: None, concurrency=2)
    assert len(started) < 100


def test_ranges_cover_the_span_exactly() -> None:
    assert split_ranges(3, 10, 4) == [(3, 4), (7, 3)]
    assert split_ranges(5, 5, 4) == []


def test_part_size_grows_only_when_the_file_needs_more_than_the_part_limit() -> None:
    mib = 1024 * 1024
    assert part_size_for(100 * mib, 64 * mib) == 64 * mib
    big = 2 * 1024**4
    grown = part_size_for(big, 64 * mib)
    assert grown % mib == 0 and -(-big // grown) <= MAX_PARTS


def _bytes_source(data: bytes):
    """``open_range`` over ``data`` (an in-memory file)."""
    def open_range(offset: int, length: int):
        return contextlib.nullcontext(io.BytesIO(data[offset:offset + length]))
    return open_range


def _short_source(offset: int, length: int):
    return contextlib.nullcontext(io.BytesIO(b"x" * (length - 1)))


def test_download_refuses_a_source_shorter_than_promised(tmp_path: Path) -> None:
    with pytest.raises(VerificationFailed, match="shorter"):
        download_ranges(tmp_path / "out", size=100, open_range=_short_source, range_size=30)


def test_upload_hashes_the_bytes_it_sent_in_file_order(tmp_path: Path) -> None:
    data = bytes(range(256)) * 1000
    src = tmp_path / "src"
    src.write_bytes(data)
    received: dict[int, bytes] = {}

    def send(number: int, part: bytes) -> str:
        time.sleep(0.001 * (10 - number % 10))
        received[number] = bytes(part)  # the buffer is reused once send returns
        return f"etag-{number}"

    committed: list[tuple[list[str], str]] = []
    upload_batch([PartedFile(src, len(data), 10_000, send)], concurrency=4,
                 finish=lambda _, results, sha: committed.append((list(results), sha)))
    [(etags, sha)] = committed
    assert sha == hashlib.sha256(data).hexdigest()
    assert etags == [f"etag-{n}" for n in range(1, len(received) + 1)]
    assert b"".join(received[n] for n in sorted(received)) == data


def test_download_never_writes_through_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "out").symlink_to(victim)
    with pytest.raises(UnsafePath):
        download_ranges(tmp_path / "out", size=3, open_range=_bytes_source(b"xyz"))
    assert victim.read_bytes() == b"precious"


def test_ranges_finishing_out_of_order_give_the_file_and_its_digest(tmp_path: Path) -> None:
    data = bytes(range(256)) * 400  # 102400 bytes, 11 ranges of 10000

    class Slow(io.BytesIO):
        def readinto(self, view):  # later ranges answer first, a few bytes at a time
            time.sleep(0.0005 * (11 - self.index))
            return super().readinto(view[:777])

    def open_range(offset: int, length: int):
        reader = Slow(data[offset:offset + length])
        reader.index = offset // 10_000
        return contextlib.nullcontext(reader)

    got = download_ranges(tmp_path / "out", size=len(data), open_range=open_range, range_size=10_000, concurrency=4)
    assert (tmp_path / "out").read_bytes() == data
    assert got.sha256 == hashlib.sha256(data).hexdigest() and got.size == len(data)


def test_a_range_whose_body_breaks_off_is_fetched_again(tmp_path: Path) -> None:
    data = bytes(range(256)) * 100
    opened: list[int] = []

    class Breaking(io.BytesIO):
        def readinto(self, view):
            n = super().readinto(view[:100])
            if self.tell() > 300:
                raise TransientRead("connection reset", remedy="retry")
            return n

    def open_range(offset: int, length: int):
        opened.append(offset)
        body = data[offset:offset + length]
        return contextlib.nullcontext(Breaking(body) if opened.count(offset) == 1 and offset == 5000 else io.BytesIO(body))

    got = download_ranges(tmp_path / "out", size=len(data), open_range=open_range, range_size=5000, concurrency=2)
    assert opened.count(5000) == 2 and opened.count(0) == 1
    assert (tmp_path / "out").read_bytes() == data and got.sha256 == hashlib.sha256(data).hexdigest()


def test_buffers_are_reused_within_a_session_and_released_after() -> None:
    cache = BufferCache(max_bytes=4 * MiB)
    with cache.session():
        first = cache.take(3 * MiB)
        assert len(first) == 3 * MiB
        cache.give(first)
        assert cache.take(3 * MiB) is first  # reused, not reallocated
        cache.give(first)
        cache.give(bytearray(12345))  # odd sizes are not kept
        assert cache._free_bytes == 3 * MiB
    assert cache._free_bytes == 0 and cache.take(3 * MiB) is not first  # the last session dropped them


def test_a_batch_streams_files_back_to_back_and_commits_each_once(tmp_path: Path) -> None:
    blobs = [bytes(range(256)) * 300, b"", b"small", bytes(reversed(range(256))) * 90]
    finished: list[tuple[int, str]] = []
    files = [RangedFile(tmp_path / f"f{i}", len(b), _bytes_source(b)) for i, b in enumerate(blobs)]
    got = download_batch(files, concurrency=3, range_size=10_000,
                         finish=lambda i, digest: finished.append((i, digest.sha256)))
    for i, blob in enumerate(blobs):
        assert (tmp_path / f"f{i}").read_bytes() == blob  # the empty one is created too
        assert got[i].size == len(blob) and got[i].sha256 == hashlib.sha256(blob).hexdigest()
    assert sorted(finished) == [(i, hashlib.sha256(b).hexdigest()) for i, b in enumerate(blobs)]


def test_a_failing_commit_stops_the_batch_and_is_raised(tmp_path: Path) -> None:
    blobs = [bytes([i]) * 30_000 for i in range(6)]
    files = [RangedFile(tmp_path / f"f{i}", len(b), _bytes_source(b)) for i, b in enumerate(blobs)]

    def finish(i: int, digest) -> None:
        if i == 0:
            raise VerificationFailed("f0 does not match", remedy="none")

    with pytest.raises(VerificationFailed, match="f0 does not match"):
        download_batch(files, concurrency=2, range_size=10_000, finish=finish)


def test_a_batch_resumes_a_file_from_its_start_with_the_prefix_hashed_from_disk(tmp_path: Path) -> None:
    data = bytes(range(256)) * 200
    dest = tmp_path / "part"
    dest.write_bytes(data[:12_000] + b"stale bytes past the prefix")
    opened: list[int] = []

    def open_range(offset: int, length: int):
        opened.append(offset)
        return contextlib.nullcontext(io.BytesIO(data[offset:offset + length]))

    [got] = download_batch([RangedFile(dest, len(data), open_range, start=12_000)], range_size=10_000)
    assert min(opened) == 12_000 and dest.read_bytes() == data
    assert got.sha256 == hashlib.sha256(data).hexdigest()


def test_a_failed_upload_batch_aborts_every_file_it_began_and_did_not_commit(tmp_path: Path) -> None:
    events: list[tuple[str, int]] = []
    files = []
    for i in range(3):
        path = tmp_path / f"f{i}"
        path.write_bytes(bytes([i]) * 25_000)

        def send(number: int, data: bytearray, i=i) -> str:
            if i == 1 and number == 2:
                raise OSError("connection reset while sending f1")
            return f"etag-{i}-{number}"

        files.append(PartedFile(path, 25_000, 10_000, send, begin=lambda i=i: events.append(("begin", i)),
                                abort=lambda i=i: events.append(("abort", i))))
    committed: list[int] = []
    with pytest.raises(OSError, match="f1"):
        upload_batch(files, concurrency=2, finish=lambda i, results, sha: committed.append(i))
    began = {i for kind, i in events if kind == "begin"}
    aborted = {i for kind, i in events if kind == "abort"}
    assert 1 in began and aborted == began - set(committed)


def test_a_download_cuts_only_what_lies_past_its_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Bytes past the start are cut (a longer stale file ends up exactly the object), but a new empty file
    is not truncated: on ext4 a truncate to 0 makes close() flush the whole file (auto_da_alloc)."""
    data = b"the object" * 1000
    truncated: list[int] = []
    real = os.ftruncate
    monkeypatch.setattr(os, "ftruncate", lambda fd, n: (truncated.append(n), real(fd, n))[1])
    fresh = tmp_path / "fresh"
    download_ranges(fresh, size=len(data), open_range=_bytes_source(data), range_size=4096)
    assert fresh.read_bytes() == data and truncated == []
    stale = tmp_path / "stale"
    stale.write_bytes(b"x" * (3 * len(data)))
    download_ranges(stale, size=len(data), open_range=_bytes_source(data), range_size=4096)
    assert stale.read_bytes() == data and truncated == [0]


@pytest.mark.parametrize("hash_sent", [False, True])
def test_a_slow_part_holds_up_others_only_when_the_sent_bytes_are_hashed_here(tmp_path: Path, hash_sent: bool) -> None:
    """Hashed here, parts are consumed in order with their buffers, so at most 2 x concurrency are taken
    while part 1 is slow (memory stays bounded). Checked by the server, only ETags wait, and every other
    part is sent meanwhile."""
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 80)  # 20 parts of 1024 bytes
    others_sent = threading.Event()
    started: list[int] = []
    lock = threading.Lock()

    def send(number: int, data: bytearray) -> str:
        with lock:
            started.append(number)
            if len(started) == 20:
                others_sent.set()
        if number == 1:
            others_sent.wait(timeout=1.0)
            with lock:
                started_while_1_was_slow.append(len(started))
        return f"etag-{number}"

    started_while_1_was_slow: list[int] = []
    results: list[list[str]] = []
    upload_batch([PartedFile(path, 20 * 1024, 1024, send, hash_sent=hash_sent)], concurrency=2,
                 finish=lambda i, etags, sha: results.append(etags))
    assert results == [[f"etag-{n}" for n in range(1, 21)]] and sorted(started) == list(range(1, 21))
    assert started_while_1_was_slow == ([4] if hash_sent else [20])


def _direct_writes(monkeypatch) -> list[tuple[bool, int, int]]:
    """Record every write of a download as (through O_DIRECT, offset, length)."""
    from ckptflow.store.transfer import download

    seen: list[tuple[bool, int, int]] = []
    real = download._pwrite_all

    def spy(fd: int, view: memoryview, offset: int) -> None:
        import fcntl

        seen.append((bool(fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT), offset, len(view)))
        real(fd, view, offset)

    monkeypatch.setattr(download, "_pwrite_all", spy)
    return seen


def _direct_io_available(path: Path) -> bool:
    from ckptflow.store.transfer.download import _open_direct

    fd = os.open(path / "probe", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        direct = _open_direct(path / "probe", fd)
        if direct is not None:
            os.close(direct)
        return direct is not None
    finally:
        os.close(fd)
        (path / "probe").unlink()


def test_whole_aligned_blocks_go_through_o_direct_and_the_unaligned_edges_through_the_page_cache(tmp_path, monkeypatch):
    if not _direct_io_available(tmp_path):
        pytest.skip(f"{tmp_path}'s filesystem refuses O_DIRECT: the page-cache path is the one used there")
    data = os.urandom(3 * MiB + 777)
    start = 4096 * 3 + 100  # an unaligned resume offset, its prefix already in place
    dest = tmp_path / "out"
    dest.write_bytes(data[:start])
    seen = _direct_writes(monkeypatch)
    got = download_ranges(dest, size=len(data), start=start, range_size=MiB, concurrency=3,
                          open_range=lambda off, n: contextlib.nullcontext(io.BytesIO(data[off:off + n])))
    assert dest.read_bytes() == data and got.sha256 == hashlib.sha256(data).hexdigest()
    direct = [(off, n) for d, off, n in seen if d]
    assert direct and all(off % 4096 == 0 and n % 4096 == 0 for off, n in direct)
    assert sum(n for _, _, n in seen) == len(data) - start  # every byte written once
    ranges = -(-(len(data) - start) // MiB)
    assert sum(n for _, n in direct) >= len(data) - start - ranges * 2 * 4096  # all but each range's edges


def test_without_o_direct_every_piece_goes_through_the_page_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTFLOW_DIRECT_IO", "0")
    data = os.urandom(2 * MiB + 5)
    seen = _direct_writes(monkeypatch)
    got = download_ranges(tmp_path / "out", size=len(data), range_size=MiB, concurrency=2,
                          open_range=lambda off, n: contextlib.nullcontext(io.BytesIO(data[off:off + n])))
    assert (tmp_path / "out").read_bytes() == data and got.sha256 == hashlib.sha256(data).hexdigest()
    assert seen and not any(d for d, _, _ in seen)


def test_a_device_that_refuses_a_direct_write_falls_back_to_the_page_cache(tmp_path, monkeypatch):
    if not _direct_io_available(tmp_path):
        pytest.skip(f"{tmp_path}'s filesystem refuses O_DIRECT")
    import errno
    import fcntl

    from ckptflow.store.transfer import download

    real = download._pwrite_all

    def refusing(fd: int, view: memoryview, offset: int) -> None:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        real(fd, view, offset)

    monkeypatch.setattr(download, "_pwrite_all", refusing)
    data = os.urandom(2 * MiB + 5)
    got = download_ranges(tmp_path / "out", size=len(data), range_size=MiB, concurrency=2,
                          open_range=lambda off, n: contextlib.nullcontext(io.BytesIO(data[off:off + n])))
    assert (tmp_path / "out").read_bytes() == data and got.sha256 == hashlib.sha256(data).hexdigest()
