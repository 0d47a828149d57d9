"""Shared pieces of the transfer benchmarks: payloads, a sealed artifact, a raw boto3 peer, child runs."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import boto3

from ckptflow.artifact import ComponentSpec, seal_artifact
from ckptflow.store.s3 import S3Store
from peers import GiB, Measured, measured, pin_clients

MiB = 1024 * 1024

# Named artifact shapes (``--artifact``): model MiB, shard count, shard MiB.
SHAPES = {"2g": "1536+8x64", "8g": "6144+32x64", "6g-one": "6144"}


@dataclass(frozen=True)
class Shape:
    """An artifact's shape: one ``model.pt`` of ``model_mib`` and ``shards`` DCP shards of ``shard_mib``
    (plus the 4 KiB ``.metadata``)."""

    model_mib: int
    shards: int
    shard_mib: int

    @property
    def nbytes(self) -> int:
        return (self.model_mib + self.shards * self.shard_mib) * MiB

    @property
    def label(self) -> str:
        size = self.nbytes / GiB
        gib = f"{size:g} GiB" if size >= 1 else f"{self.nbytes // MiB} MiB"
        return f"{gib} ({self.model_mib}+{self.shards}x{self.shard_mib})" if self.shards else f"{gib} (one file)"


def parse_shape(spec: str) -> Shape:
    """``2g``, ``8g``, ``6g-one`` or ``MODEL_MIB[+NxSHARD_MIB]`` (``6144+32x64``: a 6 GiB model.pt and
    32 shards of 64 MiB; ``6144``: the model alone, beside a 4 KiB ``optim/.metadata``)."""
    m = re.fullmatch(r"(\d+)(?:\+(\d+)x(\d+))?", SHAPES.get(spec, spec))
    if not m:
        raise argparse.ArgumentTypeError(f"artifact shape {spec!r}: use {', '.join(SHAPES)} or MODEL_MIB[+NxSHARD_MIB]")
    return Shape(int(m[1]), int(m[2] or 0), int(m[3] or 64))


def artifact_shapes(args) -> list[Shape]:
    """The shapes a run measures: every ``--artifact`` given, else the one of ``--model-mib``/``--shards``."""
    return args.artifact or [Shape(args.model_mib, args.shards, args.shard_mib)]


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


def make_shaped(root: Path, shape: Shape) -> Path:
    """``make_artifact`` of ``shape`` under ``root`` (its own directory, one per shape)."""
    return make_artifact(root, shape.model_mib, shape.shard_mib, shape.shards)


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


def round_order(names: list[str], run: int) -> list[str]:
    """The order of ``names`` in round ``run`` when more than two ways take turns: each round starts one way
    later, so over len(names) rounds every way runs once in every position, and every other round runs
    backwards, so a way follows one neighbour in some rounds and the other in the rest (a rotation alone
    keeps every way's predecessor; ``interleaved`` is the two-way case)."""
    order = names[run % len(names):] + names[:run % len(names)]
    return order[::-1] if run % 2 else order


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
    """The options the artifact benchmarks take: the server, the artifacts' shapes, runs, a work dir,
    ``--large`` (each benchmark's 8 GiB figures) and ``--pin``."""
    ap.add_argument("--credentials", required=True)
    ap.add_argument("--model-mib", type=int, default=1536)
    ap.add_argument("--shard-mib", type=int, default=64)
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--artifact", type=parse_shape, action="append",
                    help=f"an artifact shape to measure, repeatable, in the same rounds: {', '.join(SHAPES)} or "
                    "MODEL_MIB[+NxSHARD_MIB] (default: --model-mib, --shards, --shard-mib)")
    ap.add_argument("--large", action="store_true", help="the 8 GiB figures (see the module's docstring)")
    ap.add_argument("--pin", action="store_true",
                    help="the server on CPU 0 (taskset -a -p) and every client on CPU 1 (taskset -c), for the run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--workdir", default=".ckptflow/bench")


SERVER_CPU, CLIENT_CPU = 0, 1


class Server:
    """The benchmark's SeaweedFS, found through ``state.json`` beside its credentials file (the one
    ``tests/helpers/servers.py up --root DIR`` writes): its PID, for pinning, and its master's port, for
    reclaiming the space of deleted objects between steps."""

    def __init__(self, credentials: str):
        state_file = Path(credentials).resolve().parent / "state.json"
        try:
            entry = json.loads(state_file.read_text())["servers"]["seaweedfs"]
        except (OSError, ValueError, KeyError):
            entry = None
        self.state_file = state_file
        self.pid = entry["pid"] if entry and Path(f"/proc/{entry['pid']}").exists() else None
        self.master_port = None
        if self.pid:
            cmdline = Path(f"/proc/{self.pid}/cmdline").read_bytes().split(b"\0")
            for arg in cmdline:
                if arg.startswith(b"-master.port="):
                    self.master_port = int(arg.split(b"=", 1)[1])

    def vacuum(self) -> None:
        """Ask the master to compact volumes now, so deleted objects give their disk space back (the
        8 GiB rounds would otherwise fill the disk); silently nothing where it cannot."""
        if self.master_port:
            url = f"http://127.0.0.1:{self.master_port}/vol/vacuum?garbageThreshold=0.0001"
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=600):
                pass

    @contextlib.contextmanager
    def pinned(self, enabled: bool):
        """With ``enabled``: every thread of the server on CPU 0 and every client (``peers.measured``) on
        CPU 1, until the block ends (the server's affinity is given back). Refuses the shared test
        servers and a machine with fewer than two CPUs."""
        if not enabled:
            yield
            return
        if self.pid is None:
            raise SystemExit(f"--pin: no running SeaweedFS recorded in {self.state_file}")
        if self.state_file.parent.name == "test-servers":
            raise SystemExit("--pin: refusing to pin the shared test servers; start the bench servers (make bench)")
        if not {SERVER_CPU, CLIENT_CPU} <= os.sched_getaffinity(0):
            raise SystemExit(f"--pin needs CPUs {SERVER_CPU} and {CLIENT_CPU}")
        before = ",".join(str(c) for c in sorted(os.sched_getaffinity(self.pid)))
        subprocess.run(["taskset", "-a", "-p", "-c", str(SERVER_CPU), str(self.pid)], check=True,
                       stdout=subprocess.DEVNULL)
        pin_clients(CLIENT_CPU)
        own = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {CLIENT_CPU})  # this process too: its in-process figures are the client's
        try:
            yield
        finally:
            os.sched_setaffinity(0, own)
            pin_clients(None)
            subprocess.run(["taskset", "-a", "-p", "-c", before, str(self.pid)], check=False,
                           stdout=subprocess.DEVNULL)


def print_ratios(rows: list[tuple[str, float | None, float | str | None]], title: str) -> None:
    """The ratios as a small table on stderr, after the JSON (figure, value, target)."""
    width = max([len(name) for name, _, _ in rows] + [len(title)])
    lines = [f"{title:<{width}}  {'value':>8}  target", f"{'-' * width}  {'-' * 8}  ------"]
    for name, value, target in rows:
        shown = "-" if value is None else f"{value:8.3f}"
        lines.append(f"{name:<{width}}  {shown:>8}  {'' if target is None else target}")
    print("\n".join(lines), file=sys.stderr)
