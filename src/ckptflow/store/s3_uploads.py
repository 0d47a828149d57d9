"""Multipart uploads that outlive their process: the journal that recognises them, the proof of the
parts they hold, and which unfinished ones may be aborted.

A process killed while a large file is in flight (SIGKILL, preemption) leaves its multipart upload
unfinished on the server. To resume it, the next run must know that upload and what it was for: the
endpoint lists unfinished uploads by key, but not their metadata. So when an upload is created its id
is written to a small journal, ``$CKPTFLOW_CACHE_DIR/uploads/<sha256 of scheme|endpoint|bucket|key>.json``
(default ``~/.cache/ckptflow/uploads``; never inside the artifact), with the file's size and sha256,
the part size and whether the parts carry ``ChecksumSHA256``. It is removed once the upload is
completed or aborted.

While a process uploads a key it holds an exclusive ``flock`` on the entry's ``.lock`` file. The
kernel drops it when the process dies, SIGKILL included: a held lock means a live publisher on this
machine is using that upload, and nothing here touches it; another publisher of the same key then
sends its own upload (not journaled) instead. Uploads started on other machines are not in this
journal: they are aborted only when older than a bound (``gc-uploads --older-than``, publish's stale
age), since a live one cannot be told from a dead one. That age is the server's own: its ``Initiated``
time against the ``Date`` of the listing's response, never this machine's clock (a skewed local clock
would age another host's live upload at once). Prefixes are whole path segments (``uri.segment_prefix``).

A stored part counts as proven only when the server reports a checksum for it equal to the digest
of the same byte range taken in this run's hashing pass: its ``ChecksumSHA256`` where ListParts
reports one (AWS), else its ETag compared with the range's MD5 (SeaweedFS reports only the ETag,
which is the hex MD5 of the part's bytes). Any other listed part is sent again.

``UnfinishedUploads`` is the component an ``S3Store`` holds for all of this: built from the store's client,
its destination (bucket, and the journal's and messages' names) and its part geometry, it is the store's
``multipart.resumable`` (``base.ResumableUploads``).
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import fcntl
import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from botocore.exceptions import BotoCoreError, ClientError

from ..digest import FileDigest
from ..errors import CkptflowError, NotFound, Refused
from ..fsutil import atomic_write_bytes
from . import base
from .s3_errors import NOT_FOUND, error_code, translate
from .transfer import part_size_for
from .transfer.stream import split_ranges
from .uri import destination_label, segment_prefix

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UploadEntry:
    """What the journal records of one unfinished multipart upload."""

    upload_id: str
    size: int
    sha256: str
    part_size: int
    checked: bool  # created with ChecksumAlgorithm=SHA256: every part carries its ChecksumSHA256
    created_at: str


@dataclass(frozen=True)
class PendingUpload:
    """An unfinished multipart upload as ListMultipartUploads shows it."""

    key: str
    upload_id: str
    initiated: datetime


def journal_dir() -> Path:
    root = os.environ.get("CKPTFLOW_CACHE_DIR") or Path.home() / ".cache" / "ckptflow"
    return Path(root) / "uploads"


def _entry_path(destination, key: str) -> Path:
    name = f"{destination.scheme}|{destination.endpoint}|{destination.bucket}|{key}"
    return journal_dir() / f"{hashlib.sha256(name.encode()).hexdigest()}.json"


def _read(path: Path) -> UploadEntry | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return UploadEntry(**data)
    except (OSError, ValueError, TypeError):
        return None  # absent or unreadable: nothing to resume


class Claim:
    """The exclusive hold of one key's journal entry, for the time this process uploads that key."""

    def __init__(self, path: Path, fd: int):
        self.path, self._fd = path, fd

    def read(self) -> UploadEntry | None:
        return _read(self.path)

    def write(self, entry: UploadEntry) -> None:
        atomic_write_bytes(self.path, json.dumps(asdict(entry), sort_keys=True).encode())

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def release(self) -> None:
        """Drop the hold; with no entry left, its lock file goes too (under the lock: a process that
        opened it meanwhile sees it unlinked and tries again), so the cache does not grow per key."""
        if self._fd is not None:
            if not self.path.exists():
                with contextlib.suppress(FileNotFoundError):
                    self.path.with_suffix(".lock").unlink()
            os.close(self._fd)  # drops the flock
            self._fd = None


def claim(destination, key: str) -> Claim | None:
    """Hold ``key``'s journal entry; None when a live process on this machine holds it."""
    path = _entry_path(destination, key)
    lock = path.with_suffix(".lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            current = os.stat(lock).st_ino
        except BlockingIOError:
            os.close(fd)
            return None
        except FileNotFoundError:  # unlinked by its releasing holder after we opened it
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        if current == os.fstat(fd).st_ino:
            return Claim(path, fd)
        os.close(fd)  # replaced meanwhile: lock the file that is there now


def peek(destination, key: str) -> UploadEntry | None:
    """The journal entry of ``key`` without holding it (to decide what the hashing pass takes)."""
    return _read(_entry_path(destination, key))


def is_live(destination, key: str) -> bool:
    """Whether a live process on this machine holds ``key``'s journal entry."""
    held = claim(destination, key)
    if held is None:
        return True
    held.release()
    return False


def fits(entry: UploadEntry, digest: FileDigest, part_size: int, checked: bool) -> bool:
    """Whether an unfinished upload can be completed as the upload of these bytes."""
    return (entry.size, entry.sha256, entry.part_size, entry.checked) == (digest.size, digest.sha256, part_size, checked)


def proven_parts(listed: list[dict], digest: FileDigest, part_size: int) -> dict[int, str]:
    """``{part number: ETag}`` of the listed parts proven to hold the bytes of the hashing pass: the
    right size, and a reported ``ChecksumSHA256`` equal to the range's per-part sha256, or (none
    reported) an ETag equal to the range's MD5. ``digest`` must carry parts of ``part_size``."""
    spans = split_ranges(0, digest.size, part_size)
    if digest.part_size != part_size:
        return {}
    out: dict[int, str] = {}
    for part in listed:
        number, etag = int(part["PartNumber"]), str(part.get("ETag") or "")
        if not 1 <= number <= len(spans) or int(part.get("Size", -1)) != spans[number - 1][1]:
            continue
        reported = part.get("ChecksumSHA256")
        if reported:
            if digest.parts is not None and reported == base64.b64encode(digest.parts[number - 1]).decode("ascii"):
                out[number] = etag
            continue  # a reported sha256 that is not ours: never proven by a weaker checksum
        if digest.part_md5 is not None and etag.strip('"').lower() == digest.part_md5[number - 1].hex():
            out[number] = etag
    return out


class UnfinishedUploads:
    """The unfinished multipart uploads of one bucket: resumed, listed, aborted and swept through ``client``.
    Files of ``threshold`` bytes or more go in parts of ``part_size_for(size, part_size)``."""

    def __init__(self, client, destination: base.Destination, *, threshold: int, part_size: int):
        self._client, self.destination = client, destination
        self.bucket = destination.bucket
        self.threshold, self.part_size = threshold, part_size

    def _where(self, key: str) -> str:
        return object_label(self.destination, key)

    def _error(self, exc: Exception, op: str, key: str) -> CkptflowError:
        return translate(exc, op, self._where(key), self.bucket)

    def resume(self, held: Claim | None, key: str, digest: FileDigest, part_size: int, checked: bool,
               uploads: base.UploadLog | None) -> tuple[str | None, dict[int, str]]:
        """The journaled unfinished upload of ``key`` to resume and its proven parts; ``(None, {})`` when
        there is none to resume. One left for other bytes (or another part size or checksum mode) is
        aborted: it can never be completed as this file."""
        entry = held.read() if held is not None else None
        if entry is None:
            return None, {}
        if not fits(entry, digest, part_size, checked):
            self.abort_upload(key, entry.upload_id)
            held.clear()
            uploads.aborted.append({"key": key, "upload_id": entry.upload_id, "initiated": entry.created_at,
                                    "reason": f"left by a killed upload of other bytes (size {entry.size}, "
                                              f"sha256 {entry.sha256}, part size {entry.part_size})"})
            return None, {}
        try:
            listed = self._list_parts(key, entry.upload_id)
        except NotFound:
            held.clear()  # completed or aborted since: nothing to resume
            return None, {}
        proven = proven_parts(listed, digest, part_size)
        reused_bytes = sum(min(part_size, digest.size - (n - 1) * part_size) for n in proven)
        uploads.resumed.append({"key": key, "upload_id": entry.upload_id, "reused_parts": len(proven),
                                "reused_bytes": reused_bytes, "listed_parts": len(listed)})
        log.info("%s: resuming upload %s: %d of its %d stored parts proven, %d bytes not sent again",
                 self._where(key), entry.upload_id, len(proven), len(listed), reused_bytes)
        return entry.upload_id, proven

    def _list_parts(self, key: str, upload_id: str) -> list[dict]:
        parts: list[dict] = []
        pages = self._client.get_paginator("list_parts").paginate(Bucket=self.bucket, Key=key, UploadId=upload_id)
        try:
            for page in pages:
                parts += page.get("Parts", [])
        except ClientError as exc:
            if error_code(exc) in ("NoSuchUpload", *NOT_FOUND):
                raise NotFound(f"{self._where(key)}: upload {upload_id} is gone") from None
            raise self._error(exc, "ListParts", key) from None
        except BotoCoreError as exc:
            raise self._error(exc, "ListParts", key) from None
        return parts

    def resumable_part_size(self, key: str, size: int) -> int | None:
        """The part size of a journaled unfinished upload of ``key`` for a file of ``size`` bytes (the
        hashing pass then takes per-part MD5s to prove its parts); None when there is none."""
        entry = peek(self.destination, key)
        if entry is None or entry.size != size or size < self.threshold:
            return None
        return entry.part_size if entry.part_size == part_size_for(size, self.part_size) else None

    def list_uploads(self, prefix: str) -> list[PendingUpload]:
        """Every unfinished multipart upload under ``prefix`` (whole segments), all pages."""
        return self._listing(prefix)[0]

    def _listing(self, prefix: str) -> tuple[list[PendingUpload], datetime | None]:
        """The unfinished uploads under ``prefix`` and the server's time (the first page's ``Date``)."""
        prefix = segment_prefix(prefix)
        out: list[PendingUpload] = []
        server_now = None
        pages = self._client.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket, Prefix=prefix)
        try:
            for page in pages:
                if server_now is None:
                    server_now = _server_date(page)
                out += [PendingUpload(u["Key"], u["UploadId"], u["Initiated"])
                        for u in page.get("Uploads", [])]
        except (ClientError, BotoCoreError) as exc:
            raise self._error(exc, "ListMultipartUploads", prefix) from None
        return sorted(out, key=lambda u: (u.key, u.initiated)), server_now

    def abort_upload(self, key: str, upload_id: str) -> None:
        """Abort one unfinished multipart upload; one already gone is not an error."""
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
        except ClientError as exc:
            if error_code(exc) not in ("NoSuchUpload", *NOT_FOUND):
                raise self._error(exc, "AbortMultipartUpload", key) from None
        except BotoCoreError as exc:
            raise self._error(exc, "AbortMultipartUpload", key) from None

    def upload_is_live(self, key: str, upload_id: str) -> bool | None:
        """True when a live process on this machine uploads ``key`` under this journaled upload; False
        when the journal names it but no live process holds it; None when the journal does not know it."""
        entry = peek(self.destination, key)
        if is_live(self.destination, key):
            return True
        return False if entry is not None and entry.upload_id == upload_id else None

    def abort_unused(self, key: str, upload_id: str) -> bool:
        """Abort an upload while holding its key's journal entry (so no process of this machine resumes
        it meanwhile) and drop the entry that names it; False (nothing done) when a live process holds it."""
        held = claim(self.destination, key)
        if held is None:
            return False
        try:
            self.abort_upload(key, upload_id)
            entry = held.read()
            if entry is not None and entry.upload_id == upload_id:
                held.clear()
        finally:
            held.release()
        return True

    def sweep_uploads(self, prefix: str, *, older_than: float, journaled_any_age: bool = False,
                      dry_run: bool = False) -> tuple[list[dict], list[dict]]:
        """Abort the unfinished uploads under ``prefix`` (whole segments) that no live process uses: those
        started more than ``older_than`` seconds before the server's own time and, with
        ``journaled_any_age``, every one this machine's journal names whose process is gone. One a live
        process on this machine holds is never aborted. Returns ``(aborted, kept)``, each
        ``{"key", "upload_id", "initiated", "parts", "stored_bytes", "reason"}``."""
        uploads, now = self._listing(prefix)
        if uploads and now is None:
            raise Refused(f"{self._where(segment_prefix(prefix))}: the endpoint's ListMultipartUploads "
                                     "response carries no Date header, so no upload's age can be measured on the "
                                     "server's clock; nothing was aborted",
                                     remedy="abort the uploads by hand, or use an endpoint that sends Date")
        aborted: list[dict] = []
        kept: list[dict] = []
        for up in uploads:
            try:
                parts = self._list_parts(up.key, up.upload_id)
            except NotFound:
                continue  # completed or aborted since it was listed
            live = self.upload_is_live(up.key, up.upload_id)
            # The Date header is whole seconds: a lower bound of the server's time, so of the age too.
            age = max(0.0, (now - up.initiated).total_seconds())
            row = {"key": up.key, "upload_id": up.upload_id,
                   "initiated": up.initiated.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   "parts": len(parts), "stored_bytes": sum(int(p.get("Size", 0)) for p in parts)}
            if live:
                kept.append(row | {"reason": "in use by a live process on this machine"})
            elif age > older_than or older_than <= 0:
                aborted.append(row | {"reason": f"unfinished for {age:.0f} s, longer than {older_than:.0f} s"})
            elif live is False and journaled_any_age:
                aborted.append(row | {"reason": "left by a killed upload journaled on this machine"})
            else:
                kept.append(row | {"reason": f"started {age:.0f} s ago, within {older_than:.0f} s: "
                                             "it may belong to a live process elsewhere"})
        if dry_run:
            return aborted, kept
        done = []
        for row in aborted:
            if self.abort_unused(row["key"], row["upload_id"]):
                done.append(row)
                log.info("%s: aborted unfinished upload %s (%s)", self._where(row["key"]), row["upload_id"],
                         row["reason"])
            else:
                kept.append(row | {"reason": "taken up by a live process on this machine meanwhile"})
        return done, kept


def object_label(destination: base.Destination, key: str) -> str:
    """How messages name ``key`` of an S3 (or GCS interop) store: ``s3://bucket/key at endpoint``."""
    return destination_label(destination, key)


def _server_date(page: dict) -> datetime | None:
    """The ``Date`` header of a response (RFC 7231), as an aware UTC time; None when absent or unreadable."""
    headers = (page.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    try:
        when = email.utils.parsedate_to_datetime(headers.get("date") or "")
    except (TypeError, ValueError):
        return None
    return when.astimezone(timezone.utc) if when.tzinfo else when.replace(tzinfo=timezone.utc)
