"""Transfer throughput: ckptflow's store versus raw boto3, in the same run, on the same server.

(a) raw boto3 ``upload_file`` / ``download_file`` with default transfer settings (no hashing);
(b) ckptflow: SHA-256 of the file (and of each part, in the same pass), ``put_file`` with ``sha256``
    metadata (each part refused by the server unless it matches its digest, where the endpoint enforces
    part checksums; otherwise hashed in order as sent), HEAD check of size + metadata;
    ``download_file`` with the digest computed in order while ranges arrive, then compared (both sides
    download the same object, uploaded by raw boto3 or by ckptflow in turn). Neither side
    flushes to disk here (fetch's staging does, before it commits a file: see bench/fetch.py).
Runs are interleaved so drift on a noisy machine hits both sides (``benchlib.interleaved``: a ``sync``
before each step, the order reversed every other run); the median of ``--runs`` is reported. Prints one JSON object on stdout; targets are ratios ≥ 0.85.
The bulk-transfer peers (``peers.py``: s5cmd and rclone, when installed) upload the same file and
download the same object in the same rounds; ``peers`` gives every tool's median wall time and client
CPU seconds per GiB (this process's own CPU times for the in-process sides) with ratios to s5cmd.

    python bench/transfer.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from benchlib import MiB, interleaved, raw_client, scratch_bucket, write_random
from ckptflow.digest import sha256_file
from ckptflow.store.credentials import load_credentials
from peers import Measured, Peers, table


def _report(times: dict[str, list[Measured]], size: int, args, hash_median: float, notes: list[str]) -> dict:
    med = {k: statistics.median(m.wall for m in v) for k, v in times.items()}
    mbps = {k: size / MiB / v for k, v in med.items()}
    report = {
        "size_mib": args.size_mib,
        "runs": args.runs,
        "median_seconds": {k: round(v, 3) for k, v in med.items()},
        "throughput_mib_s": {k: round(v, 1) for k, v in mbps.items()},
        "ratio_upload_ckptflow_vs_raw": round(mbps["ck_up"] / mbps["raw_up"], 3),
        "ck_up_hashing_median_seconds": round(hash_median, 3),
        "ratio_download_ckptflow_vs_raw": round(mbps["ck_down"] / mbps["raw_down"], 3),
        "target_ratio": 0.85,
        "peers": {direction: table({k.rsplit("_", 1)[0]: v for k, v in times.items() if k.endswith(direction)}, size)
                  for direction in ("_up", "_down")},
        "notes": notes,
    }
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--credentials", required=True)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=6, help="interleaved runs; the median is reported (6: each side "
                    "goes first equally often, and a 3-run median still moves by several %% on a 2-core machine "
                    "shared with the server)")
    ap.add_argument("--workdir", default=".ckptflow/bench")
    ap.add_argument("--part-mib", type=int, default=None, help="override ckptflow's multipart part size")
    args = ap.parse_args()

    creds = load_credentials(args.credentials)
    options = {"part_size": args.part_mib * MiB} if args.part_mib else {}
    size = args.size_mib * MiB
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    times: dict[str, list[Measured]] = {"raw_up": [], "ck_up": [], "raw_down": [], "ck_down": []}
    with scratch_bucket(creds, "transfer", **options) as store, tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        bucket = store.bucket
        peers = Peers(creds, Path(tmp))
        for name in peers.tools:
            times[f"{name}_up"], times[f"{name}_down"] = [], []
        raw = raw_client(creds, store)
        src = Path(tmp) / "payload.bin"
        write_random(src, size)
        dst = Path(tmp) / "down.bin"
        digests = {}
        hash_s: list[float] = []  # the part of ck_up spent hashing, before the first byte is sent

        def timed(name: str, fn, *args) -> None:
            # In this process: its own CPU seconds (every thread's), as the peers' are theirs.
            t, cpu = time.perf_counter(), os.times()
            fn(*args)
            end = os.times()
            times[name].append(Measured(time.perf_counter() - t, end.user - cpu.user + end.system - cpu.system, 0, ""))
            dst.unlink(missing_ok=True)

        def peer(name: str, direction: str, key: str) -> None:
            got = peers.put(name, src, bucket, key) if direction == "up" else peers.get(name, bucket, key, dst)
            times[f"{name}_{direction}"].append(got)
            dst.unlink(missing_ok=True)

        def ck_up(key: str) -> None:
            # As publish does: one hashing pass, with the per-part digests the store checks parts against.
            t = time.perf_counter()
            digest = sha256_file(src, part_size=store.part_digest_size(size))
            hash_s.append(time.perf_counter() - t)
            store.put_file(key, src, digest=digest)
            info = store.head(key)
            assert info is not None and info.size == digest.size and info.sha256 == digest.sha256
            digests[key] = digest

        def ck_down(key: str, uploaded: str) -> None:
            got = store.download_file(key, dst)
            assert got == digests[uploaded], "downloaded bytes do not match the digest ckptflow uploaded"

        for run in range(args.runs):
            key_raw, key_ck = f"raw/{run}", f"ckptflow/{run}"
            interleaved([partial(timed, "raw_up", raw.upload_file, str(src), bucket, key_raw),
                         partial(timed, "ck_up", ck_up, key_ck),
                         *(partial(peer, name, "up", f"{name}/{run}") for name in peers.tools)], run)
            # Both download the same object (each run the other one's), so neither gains from how the
            # server laid out the object it reads.
            key_down = (key_raw, key_ck)[run % 2]
            # An untimed download first: on this VM the first step that writes a fresh GiB of page cache
            # after the uploads runs up to twice as slow (whichever client goes first), a reading
            # alone does not warm it.
            raw.download_file(bucket, key_down, str(dst))
            dst.unlink()
            interleaved([partial(timed, "raw_down", raw.download_file, bucket, key_down, str(dst)),
                         partial(timed, "ck_down", ck_down, key_down, key_ck),
                         *(partial(peer, name, "down", key_down) for name in peers.tools)], run)
            for k in (key_raw, key_ck, *(f"{name}/{run}" for name in peers.tools)):
                store.delete(k)
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1].wall:.2f}s {v[-1].cpu:.2f} CPU-s"
                                                             for k, v in times.items()), file=sys.stderr)

    report = _report(times, size, args, statistics.median(hash_s), peers.notes)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
