"""The object-store contract every backend (S3, GCS, ``file://``) implements.

Keys are ``/``-separated strings relative to the bucket (for ``file://``: to the archive root). The
store never interprets artifact layout; the archive modules build keys from a prefix and validated
relative paths. ``sha256`` is the lowercase hex SHA-256 of the whole object, carried as user metadata
(``x-amz-meta-sha256`` on S3 and the S3-interop GCS API; on ``file://`` a JSON sidecar in
``<dir>/.ckptflow-meta/`` beside each object).

What a backend offers beyond the protocol's operations is part of the contract too (``StoreCapabilities``,
which ``ObjectStore`` includes): multipart uploads (their threshold, a journal that resumes and sweeps
unfinished ones, the server check of part checksums), the shape of ranged downloads, and how many
requests a batch keeps in flight. A backend without one says so with ``None``; callers ask these
attributes, never probe a store for methods. A paged listing (``iter_list``) is an operation of every
backend (a ``file://`` tree is one page).
"""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, runtime_checkable

from ..digest import FileDigest
from ..progress import ByteProgress
from .uri import StoreURI, destination_uri

# Above this size put_file uses a multipart upload with parts sent concurrently. Parts in flight are
# held in memory (at most 2 * concurrency of them), so 8 MiB parts keep an upload under ~128 MiB;
# on loopback SeaweedFS, 8 MiB parts were also faster than 64 MiB ones.
DEFAULT_MULTIPART_THRESHOLD = 16 * 1024 * 1024
DEFAULT_PART_SIZE = 8 * 1024 * 1024
DEFAULT_CONCURRENCY = 8


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a HEAD (or a listing, where ``sha256`` is then None) says about one object."""

    key: str
    size: int
    sha256: str | None = None
    etag: str | None = None
    # Server-verified SHA-256 (hex) where the endpoint stores one for single-part uploads.
    checksum_sha256: str | None = None
    # The server checksum exactly as the endpoint reports it (S3 ``ChecksumSHA256``: "<b64>" for a
    # single part, "<b64>-N" for a composite of N parts); None where it computes none for this object.
    checksum: str | None = None
    # When the object was last written (POSIX seconds): from a listing (S3 ``LastModified``, a file's
    # mtime); None where the backend did not say.
    modified: float | None = None


def server_checksums_of(digest: FileDigest) -> tuple[str, ...]:
    """The ``ChecksumSHA256`` values an S3 endpoint reports for bytes with this digest: the whole-object
    one, and with per-part digests the composite (sha256 of the part digests, ``-N``)."""
    out = [base64.b64encode(bytes.fromhex(digest.sha256)).decode("ascii")]
    if digest.parts:
        joined = hashlib.sha256(b"".join(digest.parts)).digest()
        out.append(f"{base64.b64encode(joined).decode('ascii')}-{len(digest.parts)}")
    return tuple(out)


@dataclass
class UploadLog:
    """What ``put_files(uploads=...)`` did with unfinished multipart uploads, for the report: uploads
    resumed (``{"key", "upload_id", "reused_parts", "reused_bytes"}``), uploads aborted (``{"key",
    "upload_id", "initiated", "reason"}``) and the payload bytes actually sent."""

    resumed: list[dict] = field(default_factory=list)
    aborted: list[dict] = field(default_factory=list)
    sent_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def sent(self, n: int) -> None:
        with self._lock:
            self.sent_bytes += n


@dataclass(frozen=True, slots=True)
class Destination:
    """The non-secret identity of where objects live: what receipts and probe records store."""

    scheme: str  # "s3", "gs" or "file"
    endpoint: str  # endpoint authority (host[:port]) or, for file://, the archive root path
    bucket: str

    def as_dict(self) -> dict[str, str]:
        return {"scheme": self.scheme, "endpoint": self.endpoint, "bucket": self.bucket}

    def uri(self, key: str = "") -> StoreURI:
        """The URI of ``key`` here (``uri.destination_uri``)."""
        return destination_uri(self, key)


class DownloadShape(NamedTuple):
    """How a store's downloads are cut: the connections kept busy and the size of each ranged GET (or read)."""

    connections: int
    range_size: int


@runtime_checkable
class ResumableUploads(Protocol):
    """Multipart uploads that outlive their process, journaled on this machine (S3). A store that has them
    takes ``put_files(..., uploads=UploadLog())``: a journaled unfinished upload of the same bytes is
    resumed, one of other bytes aborted."""

    def resumable_part_size(self, key: str, size: int) -> int | None:
        """The part size of a journaled unfinished upload of ``key`` for a file of ``size`` bytes (the
        hashing pass then takes per-part MD5s to prove its stored parts); None when there is none."""

    def sweep_uploads(self, prefix: str, *, older_than: float, journaled_any_age: bool = False,
                      dry_run: bool = False) -> tuple[list[dict], list[dict]]:
        """Abort the unfinished uploads under ``prefix`` that no live process uses; ``(aborted, kept)``."""


@dataclass(frozen=True)
class MultipartUploads:
    """How a store sends large files: in parts, from ``threshold`` bytes on."""

    threshold: int
    #: Unfinished uploads journaled, resumed and swept (S3); None where none are kept (GCS interop).
    resumable: ResumableUploads | None = None
    #: ``part_checksums_enforced(key)``: whether the endpoint refuses a part whose bytes do not match its
    #: ``ChecksumSHA256`` (asked once per store, at a scratch upload under ``key``); None where parts never
    #: carry one.
    part_checksums_enforced: Callable[[str], bool] | None = None


class SmallGets(Protocol):
    """Whole small objects read faster than one ``get_bytes`` each, for a caller that reads many (``ls``)."""

    def get_bytes(self, key: str, *, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        """The store's ``get_bytes(key)``: the same bytes or the same error, by a cheaper request where it can."""


@runtime_checkable
class StoreCapabilities(Protocol):
    """What a backend offers beyond the operations of ``ObjectStore``; each one present or explicitly None."""

    #: None: every file is written whole (``file://``).
    multipart: MultipartUploads | None
    #: How ``download_file`` and ranged reads (fetch, verify's read back) are cut.
    download_shape: DownloadShape
    #: Requests a batch of small operations keeps in flight (the parts of an upload, the GETs of a listing).
    concurrency: int
    #: Many small whole-object reads (S3: signed outside botocore's request path); None: ``get_bytes`` is it.
    small_gets: SmallGets | None
    #: The largest object ``adopt_object`` can give its ``sha256`` metadata without its bytes being sent
    #: again (S3: a server-side copy, at most 5 GiB); 0: none (a larger one is sent).
    adopts_objects_up_to: int


class RangeReader(Protocol):
    """What ``open_range`` yields: ``readinto`` of the next bytes of the range (0 at its end)."""

    def readinto(self, view: memoryview, /) -> int: ...


@runtime_checkable
class ObjectStore(StoreCapabilities, Protocol):
    destination: Destination
    #: True when single-part puts carry a server-verified SHA-256 (S3 ``ChecksumSHA256``).
    supports_checksum_sha256: bool

    def require_bucket(self) -> None:
        """Raise ``NotFound`` naming the bucket (or ``file://`` root) when it does not exist."""
        ...

    def head(self, key: str) -> ObjectInfo | None:
        """Size, sha256 metadata and etag of ``key``; None when it does not exist."""

    def put_bytes_create_once(self, key: str, data: bytes, *, sha256: str) -> bool:
        """Create ``key`` with ``data`` only if it does not exist. True: created; False: it existed.

        Enforcement is the server's (``If-None-Match: *``, ``x-goog-if-generation-match: 0``,
        ``link``); whether an endpoint really enforces it is what ``ckptflow probe`` qualifies.
        """

    def put_file(
        self, key: str, path: Path, *, digest: FileDigest, progress: ByteProgress | None = None
    ) -> ObjectInfo:
        """Upload ``path`` (whose size and sha256 the caller computed) with ``sha256`` metadata.

        Multipart above the backend's threshold, parts concurrently; single-part uploads also send
        ``ChecksumSHA256`` where supported, so the server rejects corrupted bytes on receipt.
        """

    def part_digest_size(self, size: int) -> int | None:
        """The part size whose per-part digests (``sha256_file(part_size=...)``) ``put_file`` would use for
        a file of ``size`` bytes, to have the server refuse any part that differs from the bytes hashed;
        None when it would not use them (single-part uploads, backends without verified part checksums)."""

    def put_files(
        self,
        files: Sequence[tuple[str, Path, FileDigest]],
        *,
        progress: ByteProgress | None = None,
        on_stored: Callable[[str], None] | None = None,
    ) -> list[ObjectInfo]:
        """``put_file`` for each ``(key, path, digest)``, as one stream where the backend can (no idle
        connections between files); ``on_stored(key)`` follows each file stored and verified."""

    def adopt_object(self, key: str, digest: FileDigest, *, etag: str | None) -> ObjectInfo | None:
        """Give the object at ``key``, whose bytes the caller read and found to be ``digest``'s, the ``sha256``
        metadata HEAD checks, without sending its bytes and without changing them: ``file://`` adds the
        sidecar, S3 copies the object onto itself server-side, only from the object whose ETag is ``etag``
        (the one that was read). Its HEAD afterwards; None when it cannot (another object is there now, a
        sidecar already stands, the size is over ``adopts_objects_up_to``): the caller sends the file."""

    def get_bytes(self, key: str, *, max_bytes: int = 64 * 1024 * 1024) -> bytes:
        """Whole small object (records); refuse objects larger than ``max_bytes``."""

    def download_file(
        self,
        key: str,
        dest: Path,
        *,
        size: int | None = None,
        start: int = 0,
        hasher=None,
        progress: ByteProgress | None = None,
    ) -> FileDigest:
        """Write bytes ``[start, size)`` of ``key`` into ``dest`` (created or extended in place).

        Ranges are fetched concurrently and hashed in order as they arrive (one pass, no re-read).
        With ``start > 0`` the caller passes ``hasher`` already fed with the verified prefix.
        Returns the size and sha256 of the whole file. ``size`` defaults to a HEAD.
        """

    def open_range(self, key: str, offset: int, length: int) -> AbstractContextManager[RangeReader]:
        """A reader (``readinto``) of bytes ``[offset, offset + length)`` of ``key``, for ranged downloads.

        A body that breaks off raises ``transfer.stream.TransientRead`` (the range is fetched again); an object
        whose size differs from the span asked for is a ``VerificationFailed``.
        """

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with ``prefix``, all pages, sorted by key."""

    def iter_list(self, prefix: str) -> Iterator[ObjectInfo]:
        """``list``'s objects as the backend yields them, a page at a time (in key order within a page), so
        a caller can act on one page while the next is fetched."""

    def delete(self, key: str) -> None:
        """Remove ``key``; absent is not an error."""
