"""Small real disks for the full-disk tests: tmpfs mounts (root only).

Where mounting is impossible the test skips with the reason, except when ``CI`` is set: there it fails,
so the full-disk guarantees are never silently untested.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs_mounts(root: Path) -> Iterator[Callable[[int], Path]]:
    """``mount(nbytes)`` makes a fresh tmpfs of that size under ``root``; all are unmounted on exit."""
    mounted: list[Path] = []

    def mount(nbytes: int) -> Path:
        where = root / f"disk{len(mounted)}"
        where.mkdir(parents=True)
        reason = None
        if os.geteuid() != 0:
            reason = "mounting a tmpfs needs root"
        elif shutil.which("mount") is None:
            reason = "no mount command"
        else:
            proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={nbytes}", "tmpfs", str(where)],
                                  capture_output=True, text=True)
            if proc.returncode != 0:
                reason = f"mount -t tmpfs failed: {proc.stderr.strip() or proc.returncode}"
        if reason is not None:
            if os.environ.get("CI"):
                pytest.fail(f"{reason}, and CI is set: the full-disk guarantees must be tested there")
            pytest.skip(f"{reason}: the full-disk tests need a small tmpfs")
        mounted.append(where)
        return where

    try:
        yield mount
    finally:
        for where in reversed(mounted):
            subprocess.run(["umount", str(where)], check=True)


def fill(disk: Path, leave: int) -> Path:
    """Another writer: a file that takes all but ``leave`` bytes of the disk's free space."""
    filler = disk / "other-writer.bin"
    with open(filler, "ab") as fh:
        fh.write(b"\0" * (shutil.disk_usage(disk).free - leave))
    assert abs(shutil.disk_usage(disk).free - leave) < 64 * 1024
    return filler
