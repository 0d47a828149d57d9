"""One materializer per output: ``<out>.lock`` beside the output (the shared mechanism, and what it may
remove, is ``ckptflow.lock``).

The lock is an optimisation, not the guarantee: every step that puts a tree in place stays one rename of
a uniquely named tree (``output.py``), so two requests that both get the lock (``flock`` is a no-op on some cluster
file systems) still never discard each other's export.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..lock import DEFAULT_WAIT_SECONDS, check_wait_seconds, held_lock

__all__ = ["DEFAULT_WAIT_SECONDS", "check_wait_seconds", "lock_path", "output_lock"]


def lock_path(out: Path) -> Path:
    return out.with_name(out.name + ".lock")


@contextlib.contextmanager
def output_lock(out: Path, wait_seconds: float) -> Iterator[Path | None]:
    """Hold ``<out>.lock`` for the block; wait up to ``wait_seconds`` for another holder, then raise
    ``Refused`` naming it (nothing touched). Yields the lock's path (None when a test disabled it)."""
    with held_lock(lock_path(out), wait_seconds, step="materialize", busy=f"{out} is being materialized by another request",
                   remedy="let that request finish, then rerun (it skips once the same build is published), "
                   "or raise --lock-wait-seconds") as path:
        yield path
