"""The ``file://`` backend: an archive directory on a shared file system (NFS, Lustre, GPFS).

Layout (key ``p/iter_5/model.pt`` under root ``/archive``)::

    /archive/p/iter_5/model.pt                              the object's bytes, a regular file
    /archive/p/iter_5/.ckptflow-meta/model.pt.json          {"sha256": "<hex>", "size": N}
    /archive/p/iter_5/.ckptflow-meta/.model.pt.<host>.<pid>.<token>.tmp   in-flight writes only

Metadata sits beside its object, not at the root, so any directory inside an archive is itself a valid
root (see ``uri.py``). ``.ckptflow-meta`` is a reserved name: no key may contain it and listings skip
it, so temporaries and sidecars never show up as objects.

Ordering, which holds without locks (``flock`` lies on some shared file systems):
- A visible object always has its sidecar: the sidecar is published before the object is linked or
  renamed into place; ``delete`` removes the object before the sidecar.
- ``put_bytes_create_once`` publishes the sidecar with ``link`` (atomic, fails if it exists), so exactly
  one writer owns a key, then links its bytes into place. A sidecar without its object is either a
  writer between its two links (the object appears shortly) or a crashed writer: the same bytes
  complete the creation, other bytes are refused by name after a short wait.
- ``put_file`` copies into a unique temporary in the same directory, checks the bytes against the
  caller's digest while copying, fsyncs, then renames (last writer wins, as on S3).
``head`` trusts a sidecar only when its size matches the file, so a torn pair reads as "no sha256"
(verification then fails closed) rather than as a wrong digest.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from pathlib import Path

from ..digest import FileDigest, is_sha256_hex, sha256_bytes, sha256_file
from ..errors import (
    ConflictError,
    InvalidRecord,
    NotFound,
    Refused,
    UnsafePath,
    UsageError,
    VerificationFailed,
)
from ..fsutil import atomic_write_bytes, create_exclusive_bytes, fsync_dir, resolve_inside, unique_temp_path
from ..jsonio import encode_json, read_json_object
from ..progress import ByteProgress
from . import base
from .transfer import DEFAULT_RANGE_SIZE, FileRange, download_ranges
from .uri import validate_key, validate_prefix

META_DIR = ".ckptflow-meta"
log = logging.getLogger(__name__)


class LocalStore:
    """Objects as files under ``root``; ``destination`` is ``Destination("file", "<root>", "")``. Every file
    is copied whole (``multipart`` None); reads are cut in ``range_size`` ranges, ``concurrency`` at a time."""

    supports_checksum_sha256 = False
    multipart = None
    small_gets = None  # a file read is already as cheap as a record read gets
    adopts_objects_up_to = 1 << 62  # a sidecar of any object's size

    def __init__(self, root: Path | str, *, concurrency: int = base.DEFAULT_CONCURRENCY,
                 range_size: int = DEFAULT_RANGE_SIZE, creator_wait_s: float = 5.0):
        root = Path(os.path.abspath(os.fspath(root)))
        self.root = root
        self.concurrency = concurrency
        self.range_size = range_size
        self.download_shape = base.DownloadShape(concurrency, range_size)
        self.creator_wait_s = creator_wait_s
        self.destination = base.Destination("file", str(root), "")

    def __repr__(self) -> str:
        return f"LocalStore(file://{self.root})"

    # ------------------------------------------------------------------ paths

    def _paths(self, key: str) -> tuple[Path, Path]:
        rel = validate_key(key)
        if META_DIR in rel.split("/"):
            raise UnsafePath(f"object key {key!r} uses the reserved name {META_DIR}",
                             remedy="choose another key; that directory holds the store's metadata")
        obj = resolve_inside(self.root, rel, what=f"object key {key!r}")
        return obj, obj.parent / META_DIR / f"{obj.name}.json"

    def require_bucket(self) -> None:
        """The archive root must exist: it is never created by a write (a typo would start a new archive)."""
        self._require_root()

    def _require_root(self) -> None:
        if not self.root.is_dir():
            raise NotFound(f"archive root {self.root} does not exist",
                           remedy="create it, or mount the shared file system that holds it", path=str(self.root))

    def _prepare(self, obj: Path) -> None:
        self._require_root()
        (obj.parent / META_DIR).mkdir(parents=True, exist_ok=True)

    def _open(self, obj: Path, key: str) -> int:
        try:
            fd = os.open(obj, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise NotFound(f"{obj} does not exist", remedy="check the archive root and key", path=str(obj)) from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePath(f"{obj} is a symlink", remedy="archives hold regular files only") from None
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise NotFound(f"{obj} is not a regular file", remedy=f"key {key!r} names a directory", path=str(obj))
        return fd

    @staticmethod
    def _meta_bytes(sha256: str, size: int) -> bytes:
        return encode_json({"sha256": sha256, "size": size})

    def _read_meta(self, meta: Path) -> dict | None:
        try:
            obj = read_json_object(meta)
        except NotFound:
            return None
        except InvalidRecord as exc:
            log.warning("ignoring unreadable metadata sidecar %s: %s", meta, exc)
            return None
        if not is_sha256_hex(obj.get("sha256")) or type(obj.get("size")) is not int:
            log.warning("ignoring metadata sidecar %s: it lacks a valid sha256 and size", meta)
            return None
        return obj

    # ------------------------------------------------------------------ protocol

    def head(self, key: str) -> base.ObjectInfo | None:
        obj, meta = self._paths(key)
        try:
            st = os.lstat(obj)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISDIR(st.st_mode):
            return None
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(f"{obj} is not a regular file", remedy="archives hold regular files only")
        info = self._read_meta(meta)
        sha = info["sha256"] if info is not None and info["size"] == st.st_size else None
        return base.ObjectInfo(key=key, size=st.st_size, sha256=sha)

    def put_bytes_create_once(self, key: str, data: bytes, *, sha256: str) -> bool:
        obj, meta = self._paths(key)
        if not is_sha256_hex(sha256) or sha256_bytes(data) != sha256:
            raise UsageError(f"sha256 given for {obj} does not match the bytes to write")
        self._prepare(obj)
        if os.path.lexists(obj):
            return False
        tmp = unique_temp_path(meta.parent / obj.name)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            mine = {"sha256": sha256, "size": len(data)}
            if not create_exclusive_bytes(meta, self._meta_bytes(sha256, len(data))):
                if self._read_meta(meta) != mine and not os.path.lexists(obj):
                    if not self._wait_for(obj):
                        raise ConflictError(
                            f"{meta} describes other bytes than {obj}, which does not exist",
                            remedy=f"a writer crashed or is still running; if none is, delete {meta} and retry",
                            path=str(meta))
                    return False
            try:
                os.link(tmp, obj)
            except FileExistsError:
                return False
            fsync_dir(obj.parent)
            return True
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _wait_for(self, path: Path) -> bool:
        deadline = time.monotonic() + self.creator_wait_s
        while not os.path.lexists(path):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def put_file(self, key: str, path: Path, *, digest: FileDigest,
                 progress: ByteProgress | None = None) -> base.ObjectInfo:
        obj, meta = self._paths(key)
        path = Path(path)
        size = os.stat(path).st_size
        if size != digest.size:
            raise VerificationFailed(f"{path} has {size} bytes but was hashed at {digest.size}",
                                     remedy="the file changed after it was hashed; hash it again", path=str(path))
        self._prepare(obj)
        tmp = unique_temp_path(meta.parent / obj.name)
        src = os.open(path, os.O_RDONLY)
        try:
            copied = download_ranges(
                tmp, size=size, open_range=FileRange.opener(src),
                concurrency=self.concurrency, range_size=self.range_size, progress=progress, source=str(path))
            if copied.sha256 != digest.sha256:
                raise VerificationFailed(
                    f"{path} changed after it was hashed (its bytes now hash to {copied.sha256}, not {digest.sha256})",
                    remedy="hash it again and retry; nothing was published", path=str(path))
            atomic_write_bytes(meta, self._meta_bytes(digest.sha256, size))
            os.replace(tmp, obj)
            fsync_dir(obj.parent)
        finally:
            os.close(src)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        info = self.head(key)
        if info is None or info.sha256 != digest.sha256:
            raise VerificationFailed(f"{obj} was replaced while it was being published",
                                     remedy="another writer is publishing the same key; check the archive")
        return info

    def part_digest_size(self, size: int) -> int | None:
        return None  # put_file hashes the bytes it copies

    def adopt_object(self, key: str, digest: FileDigest, *, etag: str | None = None) -> base.ObjectInfo | None:
        """Add the sidecar of an object whose bytes are ``digest``'s, never touching the object: its bytes
        are hashed here again through one descriptor (the cheap proof of a local file, and the one that
        binds the sidecar to this very file), the sidecar created only where none stands, and the path
        must still name that file afterwards. ``etag`` is not used: a file has none."""
        obj, meta = self._paths(key)
        fd = self._open(obj, key)
        try:
            before = os.fstat(fd)
            if before.st_size != digest.size or sha256_file(fd) != FileDigest(digest.size, digest.sha256):
                return None
        finally:
            os.close(fd)
        self._prepare(obj)
        if not create_exclusive_bytes(meta, self._meta_bytes(digest.sha256, digest.size)):
            return None
        try:
            now = os.lstat(obj)
        except FileNotFoundError:
            now = None
        if now is None or (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns) != (
                before.st_dev, before.st_ino, before.st_size, before.st_mtime_ns):
            return None  # replaced meanwhile: the caller's put_file writes object and sidecar afresh
        return self.head(key)

    def put_files(self, files, *, progress: ByteProgress | None = None, on_stored=None) -> list[base.ObjectInfo]:
        infos = []
        for key, path, digest in files:
            infos.append(self.put_file(key, path, digest=digest, progress=progress))
            if on_stored is not None:
                on_stored(key)
        return infos

    def download_file(self, key: str, dest: Path, *, size: int | None = None, start: int = 0, hasher=None,
                      progress: ByteProgress | None = None) -> FileDigest:
        obj, _ = self._paths(key)
        fd = self._open(obj, key)
        try:
            if size is None:
                size = os.fstat(fd).st_size
            return download_ranges(
                Path(dest), size=size, start=start, hasher=hasher, progress=progress, concurrency=self.concurrency,
                range_size=self.range_size, source=str(obj),
                open_range=FileRange.opener(fd))
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def open_range(self, key: str, offset: int, length: int):
        obj, _ = self._paths(key)
        fd = self._open(obj, key)
        try:
            yield FileRange(fd, offset, length)
        finally:
            os.close(fd)

    def get_bytes(self, key: str, *, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        obj, _ = self._paths(key)
        fd = self._open(obj, key)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise Refused(f"{obj} is larger than the {max_bytes} bytes allowed for a record",
                          remedy="this key does not hold a record; check the prefix")
        return data

    def list(self, prefix: str) -> list[base.ObjectInfo]:
        validate_prefix(prefix)
        self._require_root()
        base_dir = prefix.rpartition("/")[0]
        if META_DIR in base_dir.split("/"):
            return []
        start = resolve_inside(self.root, base_dir, what=f"listing prefix {prefix!r}") if base_dir else self.root
        if not start.is_dir():
            return []
        out: list[base.ObjectInfo] = []
        self._walk(start, base_dir, prefix, out)
        return sorted(out, key=lambda info: info.key)

    def iter_list(self, prefix: str):
        return iter(self.list(prefix))  # one walk: a directory tree has no pages

    def _walk(self, directory: Path, rel: str, prefix: str, out: list[base.ObjectInfo]) -> None:
        with os.scandir(directory) as entries:
            for entry in entries:
                key = f"{rel}/{entry.name}" if rel else entry.name
                st = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    if entry.name != META_DIR and (key.startswith(prefix) or prefix.startswith(key + "/")):
                        self._walk(Path(entry.path), key, prefix, out)
                elif stat.S_ISREG(st.st_mode):
                    if key.startswith(prefix):
                        out.append(base.ObjectInfo(key=key, size=st.st_size, modified=st.st_mtime))
                elif key.startswith(prefix):
                    raise UnsafePath(f"{entry.path} is a symlink or special file, not an object",
                                     remedy="archives hold regular files only; remove it")

    def delete(self, key: str) -> None:
        obj, meta = self._paths(key)
        try:
            if not stat.S_ISDIR(os.lstat(obj).st_mode):
                os.unlink(obj)
        except (FileNotFoundError, NotADirectoryError):
            pass
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.unlink(meta)
        with contextlib.suppress(FileNotFoundError):
            fsync_dir(obj.parent)
