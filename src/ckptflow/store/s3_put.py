"""Sending files to an S3 store (``S3Store.put_files``): one ``FileUpload`` per file, the small ones as a
single PUT checked against their digest before it is sent, the large ones as one stream of multipart
uploads (``transfer.upload_batch``), each completed and HEAD-checked on a commit thread; and the check,
once per store, of whether the endpoint refuses a part whose bytes do not match its ``ChecksumSHA256``.

Where the caller's hashing pass took per-part digests of this upload's part size and the endpoint
enforces part checksums, every part carries its digest (signed; the body is sent ``UNSIGNED-PAYLOAD``),
so the server refuses a part whose bytes changed since they were hashed; otherwise the parts are hashed
in order as they are sent and compared before completing. A conditional multipart complete is never
used: concurrent completes are not atomic on common servers. With an ``UploadLog``, multipart uploads
are journaled and resumed (``s3_uploads``).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

from ..digest import FileDigest, sha256_bytes
from ..errors import VerificationFailed
from ..progress import ByteProgress
from . import base, s3_uploads
from .s3_errors import BAD_DIGEST, error_code
from .transfer import PartedFile, part_size_for, upload_batch
from .uri import validate_key

if TYPE_CHECKING:
    from .s3 import S3Store


@dataclass
class FileUpload:
    """One file of a ``put_files`` call: where it goes, the bytes hashed, and how it is being sent."""

    key: str
    path: Path
    digest: FileDigest
    #: Its multipart upload; None: a single PUT (below the store's multipart threshold).
    parted: PartedFile | None = None
    #: The journal entry this process holds while the file is sent (with an ``UploadLog`` only).
    claim: s3_uploads.Claim | None = None
    #: What HEAD showed once it was stored and checked.
    stored: base.ObjectInfo | None = None


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def b64_sha256(hex_digest: str) -> str:
    return b64(bytes.fromhex(hex_digest))


def _check_composite(value: str | None, parts: Sequence[bytes], where: str) -> None:
    """A completed upload's composite ``ChecksumSHA256`` (sha256 of the part digests, ``-N``), where the
    endpoint returns one, must be the one of the part digests that were sent."""
    if not value:
        return
    expected = b64(hashlib.sha256(b"".join(parts)).digest())
    if value.split("-", 1)[0] != expected:
        raise VerificationFailed(f"{where}: the completed upload's checksum {value} is not that of the parts "
                                 f"sent ({expected}-{len(parts)}); the object was deleted",
                                 remedy="the endpoint assembled other parts; publish again")


def put_files(store: S3Store, files: Sequence[tuple[str, Path, FileDigest]], *,
              progress: ByteProgress | None = None, on_stored: Callable[[str], None] | None = None,
              uploads: base.UploadLog | None = None) -> list[base.ObjectInfo]:
    """``S3Store.put_files``: every file stored and HEAD-checked, in the order given."""
    plan = [FileUpload(key, Path(path), digest) for key, path, digest in files]
    try:
        for f in plan:
            validate_key(f.key)
            size = os.stat(f.path).st_size
            if size != f.digest.size:
                raise VerificationFailed(f"{f.path} has {size} bytes but was hashed at {f.digest.size}",
                                         remedy="the file changed after it was hashed; hash it again",
                                         path=str(f.path))
            if size >= store.multipart_threshold and size > 0:
                _parted(store, f, progress, uploads)
        _put_all(store, plan, progress, on_stored, uploads)
        return [f.stored for f in plan]  # type: ignore[misc]
    finally:
        for f in plan:
            if f.claim is not None:
                f.claim.release()


def _put_all(store: S3Store, plan: list[FileUpload], progress: ByteProgress | None,
             on_stored: Callable[[str], None] | None, uploads: base.UploadLog | None) -> None:
    parted = [f for f in plan if f.parted is not None]

    def commit(j: int, etags: list[str], sent: str | None) -> None:
        f = parted[j]
        if sent is not None and sent != f.digest.sha256:
            raise VerificationFailed(
                f"{f.path} changed after it was hashed (its bytes now hash to {sent}, not {f.digest.sha256})",
                remedy="hash it again and retry; the multipart upload was aborted", path=str(f.path))
        parts = [{"ETag": etag, "PartNumber": n} for n, etag in enumerate(etags, start=1)]
        if sent is None:  # every part was checked by the server against the digest taken when hashing
            for part, raw in zip(parts, f.digest.parts, strict=True):
                part["ChecksumSHA256"] = b64(raw)
        done = store._call("CompleteMultipartUpload", f.key, store._client.complete_multipart_upload,
                           Bucket=store.bucket, Key=f.key, UploadId=f.parted.handle, MultipartUpload={"Parts": parts})
        if f.claim is not None:
            f.claim.clear()
        if sent is None:
            try:
                _check_composite(done.get("ChecksumSHA256"), f.digest.parts, store._where(f.key))
            except VerificationFailed:
                # Completed from other bytes than the parts sent: it must not stay under this digest.
                store.delete(f.key)
                raise
        f.stored = _check_stored(store, f.key, f.digest)
        if on_stored is not None:
            on_stored(f.key)

    if parted:
        upload_batch([f.parted for f in parted], concurrency=store.concurrency, finish=commit)
    for f in plan:
        if f.parted is None:
            # A single part is below the multipart threshold: it is read whole and its bytes are
            # checked against the digest before they are sent, so a file changed after hashing is
            # refused here too, also on endpoints that do not verify ChecksumSHA256.
            with open(f.path, "rb") as fh:
                data = fh.read(f.digest.size + 1)
            if len(data) != f.digest.size or sha256_bytes(data) != f.digest.sha256:
                raise VerificationFailed(
                    f"{f.path} changed after it was hashed (it now holds {len(data)} bytes with sha256 "
                    f"{sha256_bytes(data)}, not {f.digest.size} bytes with {f.digest.sha256})",
                    remedy="hash it again and retry; nothing was uploaded", path=str(f.path))
            kwargs = {"Bucket": store.bucket, "Key": f.key, "ContentLength": f.digest.size,
                      "Metadata": {"sha256": f.digest.sha256}}
            if store.supports_checksum_sha256:
                kwargs["ChecksumSHA256"] = b64_sha256(f.digest.sha256)
            store._call("PUT", f.key, store._client.put_object, Body=data, **kwargs)
            if uploads is not None:
                uploads.sent(f.digest.size)
            if progress is not None:
                progress.update(f.digest.size)
            f.stored = _check_stored(store, f.key, f.digest)
            if on_stored is not None:
                on_stored(f.key)


def _check_stored(store: S3Store, key: str, digest: FileDigest) -> base.ObjectInfo:
    info = store.head(key)
    if info is None or info.size != digest.size or info.sha256 != digest.sha256:
        raise VerificationFailed(
            f"{store._where(key)} does not show the size and sha256 just uploaded",
            remedy="the endpoint dropped the upload or its metadata; run `ckptflow probe` on it")
    return info


def _parted(store: S3Store, f: FileUpload, progress: ByteProgress | None, uploads: base.UploadLog | None) -> None:
    """Give ``f`` its multipart upload, created when its first part is sent (or, with ``uploads``, the
    unfinished one a killed run left for these bytes, see ``UnfinishedUploads.resume``).

    Where the digest carries per-part digests of this upload's part size and the endpoint refuses a
    part that does not match its ``ChecksumSHA256``, each part is sent with the digest taken when
    the file was hashed (and without a signature hash of the body): a byte changed since then, or
    on the way, makes the server refuse the part. Otherwise the sent bytes are hashed in order here
    and compared before the upload is completed.
    """
    key, path, digest = f.key, f.path, f.digest
    part_size = part_size_for(digest.size, store.part_size)
    checked = (store.part_checksums and digest.parts is not None and digest.part_size == part_size
               and len(digest.parts) == -(-digest.size // part_size) and store.part_checksums_enforced(key))
    client = store._unsigned() if checked else store._client
    extra = {"ChecksumAlgorithm": "SHA256"} if checked else {}
    held = f.claim = s3_uploads.claim(store.destination, key) if uploads is not None else None
    handle, reused = store.unfinished.resume(held, key, digest, part_size, checked, uploads)

    def begin() -> None:
        if parted.handle is not None:  # resumed
            return
        created = store._call("CreateMultipartUpload", key, client.create_multipart_upload,
                              Bucket=store.bucket, Key=key, Metadata={"sha256": digest.sha256}, **extra)
        parted.handle = created["UploadId"]
        if held is not None:
            now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            held.write(s3_uploads.UploadEntry(parted.handle, digest.size, digest.sha256, part_size, checked, now))

    def send(number: int, data: bytearray) -> str:
        checksum = {"ChecksumSHA256": b64(digest.parts[number - 1])} if checked else {}
        try:
            resp = store._call(f"UploadPart {number}", key, client.upload_part, Bucket=store.bucket, Key=key,
                               UploadId=parted.handle, PartNumber=number, Body=data, ContentLength=len(data),
                               **checksum)
        except VerificationFailed as exc:
            raise VerificationFailed(
                f"{path} changed after it was hashed, or part {number} was damaged on the way: {exc.message}",
                remedy="hash it again and retry; the multipart upload was aborted", path=str(path)) from None
        if uploads is not None:
            uploads.sent(len(data))
        return resp["ETag"]

    def abort() -> None:
        with contextlib.suppress(ClientError, BotoCoreError):
            store._client.abort_multipart_upload(Bucket=store.bucket, Key=key, UploadId=parted.handle)
        if held is not None:
            held.clear()

    parted = f.parted = PartedFile(path, digest.size, part_size, send, begin=begin, abort=abort, progress=progress,
                                   hash_sent=not checked, handle=handle, reused=reused)


def check_part_checksums(client, bucket: str, key: str) -> bool:
    """Whether the endpoint refuses an upload part whose bytes do not match its ``ChecksumSHA256`` and
    accepts one that does, tried with ``client`` (unsigned payloads) on a multipart upload at ``key``
    that is always aborted (nothing becomes visible); any doubt (an error, another refusal code) answers
    False."""
    body = b"ckptflow: part checksum check\n"
    try:
        upload_id = client.create_multipart_upload(Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256")["UploadId"]
    except (ClientError, BotoCoreError):
        return False
    try:
        part = {"Bucket": bucket, "Key": key, "UploadId": upload_id, "PartNumber": 1, "Body": body}
        try:
            client.upload_part(**part, ChecksumSHA256=b64_sha256(sha256_bytes(body + b"?")))
            return False  # stored under a checksum its bytes do not have
        except ClientError as exc:
            if error_code(exc) not in BAD_DIGEST:
                return False
        client.upload_part(**part, ChecksumSHA256=b64_sha256(sha256_bytes(body)))
        return True
    except (ClientError, BotoCoreError):
        return False
    finally:
        with contextlib.suppress(ClientError, BotoCoreError):
            client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
