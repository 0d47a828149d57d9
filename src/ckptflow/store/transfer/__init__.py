"""Backend-neutral transfer machinery: concurrent ranged downloads and part uploads, hashed in order.

``stream.py`` is the machinery both directions share (ordered work on a thread pool, reused buffers,
the in-order hashing thread, commit threads); ``download.py`` fills files from ranges
(``download_ranges``, ``download_batch``); ``upload.py`` sends files in parts (``upload_batch``); ``read.py`` reads and hashes objects
with nothing written (``hash_batch``). This module re-exports what the stores and the fetch step use.
"""

from __future__ import annotations

from .download import FileRange, RangedFile, download_batch, download_ranges
from .read import HashedObject, hash_batch
from .stream import DEFAULT_RANGE_SIZE, MIN_PART_SIZE, TransientRead, part_size_for, retry_call
from .upload import PartedFile, upload_batch

__all__ = [
    "DEFAULT_RANGE_SIZE",
    "MIN_PART_SIZE",
    "FileRange",
    "HashedObject",
    "PartedFile",
    "RangedFile",
    "TransientRead",
    "download_batch",
    "download_ranges",
    "hash_batch",
    "part_size_for",
    "retry_call",
    "upload_batch",
]
