"""Shared pieces of the transfer benchmarks: payloads, a sealed artifact, a raw boto3 peer, child runs."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import boto3

from ckptflow.artifact import ComponentSpec, seal_artifact
from ckptflow.store.s3 import S3Store
from peers import Measured, measured

MiB = 1024 * 1024


def write_random(path: Path, size: int) -> None:
    """``size`` random bytes (incompressible, so no store can shortcut them)."""
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(left, 64 * MiB)
            fh.write(os.urandom(n))
            left -= n


def raw_client(creds, store):
    """The peer: a plain boto3 client with the same endpoint, keys and botocore config as ``store``'s."""
    config = store._client.meta.config  # the S3Store's own botocore Config
    return boto3.client(
        "s3",
        aws_access_key_id=creds.aws_access_key_id,
        aws_secret_access_key=creds.aws_secret_access_key,
        endpoint_url=creds.endpoint_url,
        region_name=creds.region_name or "us-east-1",
        config=config,
    )


def make_artifact(root: Path, model_mib: int, shard_mib: int, shards: int) -> Path:
    art = root / "run" / "checkpoint_artifacts" / "iter_000001"
    (art / "optim").mkdir(parents=True)
    write_random(art / "model.pt", model_mib * MiB)
    (art / "optim" / ".metadata").write_bytes(os.urandom(4096))
    for i in range(shards):
        write_random(art / "optim" / f"__{i}_0.distcp", shard_mib * MiB)
    seal_artifact(art, 1, [ComponentSpec("model", "model.pt"), ComponentSpec("optim", "optim")], progress=False)
    return art


def run_measured(args: list[str], env: dict[str, str] | None = None) -> Measured:
    """Run ``python args...`` (progress off); its wall time, CPU seconds, own peak RSS and stdout.

    The peak is ``VmHWM`` read every 20 ms until the child exits: the ``ru_maxrss`` that ``wait4`` or
    ``RUSAGE_CHILDREN`` report starts from the *parent's* RSS at fork (Linux carries the high-water mark
    across exec), which would report this script's own memory instead of the child's. The CPU seconds
    are the child's own, from ``wait4`` (see ``peers.measured``).
    """
    return measured([sys.executable, *args], {"CKPTFLOW_PROGRESS": "0", **(env or {})})


def run_child(args: list[str], env: dict[str, str] | None = None) -> tuple[float, int, str]:
    """``run_measured`` as (wall time, peak RSS in KiB, stdout)."""
    got = run_measured(args, env)
    return got.wall, got.peak_kib, got.out


def interleaved(steps: list[Callable[[], object]], run: int) -> None:
    """One round of timed ``steps``: dirty pages are flushed (``sync``) before each, so no step pays for
    the writeback of the one before, and the order reverses every other round, so neither side always
    runs right after the other."""
    for step in steps if run % 2 == 0 else steps[::-1]:
        os.sync()
        step()


@contextlib.contextmanager
def scratch_bucket(creds, kind: str, **options):
    """An ``S3Store`` on a fresh bucket for one benchmark, emptied and removed afterwards (also on failure)."""
    store = S3Store(f"bench-{kind}-{uuid.uuid4().hex[:8]}", creds, **options)
    raw_client(creds, store).create_bucket(Bucket=store.bucket)
    try:
        yield store
    finally:
        for obj in store.list(""):
            store.delete(obj.key)
        store._client.delete_bucket(Bucket=store.bucket)


def add_raw_child_args(ap, *names: str) -> None:
    """The hidden options with which a benchmark runs its raw peer in a child process of its own."""
    ap.add_argument("--raw-child", action="store_true", help=argparse.SUPPRESS)
    for name in ("--bucket", "--paths", *names):
        ap.add_argument(name, help=argparse.SUPPRESS)


def add_artifact_args(ap) -> None:
    """The options both artifact benchmarks take: the server, the artifact's shape, runs, a work dir."""
    ap.add_argument("--credentials", required=True)
    ap.add_argument("--model-mib", type=int, default=1536)
    ap.add_argument("--shard-mib", type=int, default=64)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default=".ckptflow/bench")
