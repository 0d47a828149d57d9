"""Fetch cost: ``ckptflow fetch`` versus raw boto3 ``download_file`` of the same objects.

The artifact: a 1.5 GiB ``model.pt`` and 8 DCP shards of 64 MiB (2 GiB in all), published once with
ckptflow. ckptflow's run is the real command in a child process (reading and validating the
declaration and manifest, HEAD checks, downloads through ``.part`` files hashed while written, the
size + sha256 check, renames, the staging record) and its peak RSS is reported (from this loopback
endpoint ckptflow downloads with 3 connections and 24 MiB ranges, ``store/s3.py``). The peer downloads
the same objects with ``download_file`` at concurrency 8 and 8 MiB chunks (ckptflow's shape for a remote
endpoint), one file at a time, no hashing, no fsync, also in a child process of its own (both pay interpreter start-up; each
side's peak RSS is its own ``VmHWM``). Runs are interleaved (``benchlib.interleaved``: a ``sync``
before each step, the order reversed every other run), medians printed as JSON. Targets: time ratio ≤ 1.10, fetch
peak RSS < 300 MiB (printed, not asserted).

The bulk-transfer peers (``peers.py``: s5cmd ``cp`` and rclone ``copy``, when installed) copy the same
prefix in the same rounds. For every tool the report gives the median wall time, the median client
CPU seconds per GiB (the child's own, from ``wait4``) and both as ratios to s5cmd; ``met`` checks the
fetch targets against s5cmd: wall ≤ 1.2×, peak RSS < 300 MiB, CPU per GiB within s5cmd's plus one
SHA-256 pass (measured here, in the same run) plus 30 %. The durable fetch (payloads flushed before
they count) is the one compared; ``ckptflow_nofsync`` is printed beside it.

    python bench/fetch.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path

from boto3.s3.transfer import TransferConfig

from benchlib import (
    MiB,
    add_artifact_args,
    add_raw_child_args,
    interleaved,
    make_artifact,
    raw_client,
    run_measured,
    scratch_bucket,
)
from ckptflow.archive.publish import publish_artifact
from ckptflow.records import declaration as declaration_record
from ckptflow.store import base
from ckptflow.store.credentials import load_credentials
from ckptflow.store.s3 import S3Store
from ckptflow.store.transfer import DEFAULT_RANGE_SIZE
from peers import Measured, Peers, sha256_cpu_per_gib, table

UPLOAD_PREFIX = "bench/run/20260101T000000Z/checkpoints"
ARTIFACT_PREFIX = "bench/run/20260101T000000Z/checkpoint_artifacts/iter_000001"


def _raw_child(args: argparse.Namespace) -> int:
    """The peer: ``download_file`` of each object, largest first, in a fresh interpreter like ckptflow's."""
    creds = load_credentials(args.credentials)
    raw = raw_client(creds, S3Store(args.bucket, creds))
    transfer = TransferConfig(multipart_threshold=DEFAULT_RANGE_SIZE, multipart_chunksize=DEFAULT_RANGE_SIZE,
                              max_concurrency=base.DEFAULT_CONCURRENCY)
    out = Path(args.out)
    for rel in json.loads(args.paths):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        raw.download_file(args.bucket, f"{ARTIFACT_PREFIX}/{rel}", str(out / rel), Config=transfer)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_artifact_args(ap)
    add_raw_child_args(ap, "--out")
    args = ap.parse_args()
    if args.raw_child:
        return _raw_child(args)

    creds = load_credentials(args.credentials)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Measured]] = {"raw_boto3": [], "ckptflow": [], "ckptflow_nofsync": []}
    with scratch_bucket(creds, "fetch") as store, tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        bucket = store.bucket
        peers = Peers(creds, Path(tmp))
        runs.update({name: [] for name in peers.tools})
        art = make_artifact(Path(tmp), args.model_mib, args.shard_mib, args.shards)
        publish_artifact(art, store, UPLOAD_PREFIX, progress=False)
        shutil.rmtree(art.parent.parent)  # only the archive remains: page cache holds no source copy
        declared = declaration_record.parse_declaration(store.get_bytes(f"{ARTIFACT_PREFIX}/.posttrain-archive.json"))
        files = [e for e in declared.files if e.path != ".posttrain-checkpoint-artifact.json"]
        total = sum(e.size for e in files)
        uri = f"s3://{bucket}/{ARTIFACT_PREFIX}"
        paths = json.dumps([e.path for e in sorted(files, key=lambda e: -e.size)])

        def raw_side(run: int) -> None:
            out = Path(tmp) / f"raw-{run}"
            runs["raw_boto3"].append(run_measured([__file__, "--raw-child", "--credentials", args.credentials,
                                                   "--bucket", bucket, "--paths", paths, "--out", str(out)]))
            shutil.rmtree(out)

        def ckptflow_side(run: int, fsync: bool) -> None:
            # Without flushing payloads (CKPTFLOW_FSYNC=0, scratch staging) is the like-for-like
            # comparison, since the peers never flush; the default is durable.
            stage = Path(tmp) / f"stage-{run}"
            env = {} if fsync else {"CKPTFLOW_FSYNC": "0"}
            got = run_measured(["-m", "ckptflow", "fetch", "--artifact-uri", uri, "--dst", str(stage),
                                "--credentials", args.credentials], env=env)
            report = json.loads(got.out)
            assert report["status"] == "fetched" and report["downloaded_bytes"] == total, report
            runs["ckptflow" if fsync else "ckptflow_nofsync"].append(got)
            shutil.rmtree(stage)

        def peer_side(name: str, run: int) -> None:
            out = Path(tmp) / f"{name}-{run}"
            runs[name].append(peers.download(name, bucket, ARTIFACT_PREFIX, out))
            got = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            assert got >= total, f"{name} downloaded {got} bytes, fewer than the artifact's {total}"
            shutil.rmtree(out)

        for run in range(args.runs):
            interleaved([partial(raw_side, run), partial(ckptflow_side, run, True), partial(ckptflow_side, run, False),
                         *(partial(peer_side, name, run) for name in peers.tools)], run)
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1].wall:.2f}s {v[-1].cpu:.2f} CPU-s"
                                                             for k, v in runs.items()), file=sys.stderr)
    print(json.dumps(report_of(runs, total, args.runs, peers.notes), indent=2, sort_keys=True))
    return 0


def report_of(runs: dict[str, list[Measured]], total: int, nruns: int, notes: list[str]) -> dict:
    rows = table(runs, total)
    raw_med = rows["raw_boto3"]["median_wall_s"]
    ck = rows["ckptflow"]
    report = {
        "artifact_mib": round(total / MiB),
        "runs": nruns,
        "tools": rows,
        "notes": notes,
        "ratio_time_ckptflow_vs_raw": round(ck["median_wall_s"] / raw_med, 3),
        "ratio_time_ckptflow_nofsync_vs_raw": round(rows["ckptflow_nofsync"]["median_wall_s"] / raw_med, 3),
        "fetch_peak_rss_mib": ck["peak_rss_mib"],
        "raw_peak_rss_mib": rows["raw_boto3"]["peak_rss_mib"],
        "sha256_cpu_s_per_gib": round(sha256_cpu_per_gib(), 3),
        "targets": {"ratio_time_vs_raw": 1.10, "ratio_time_vs_s5cmd": 1.2, "peak_rss_mib": 300,
                    "cpu_s_per_gib": "s5cmd's + one SHA-256 pass, + 30 %"},
    }
    if "s5cmd" in rows:
        cpu_target = (rows["s5cmd"]["median_cpu_s_per_gib"] + report["sha256_cpu_s_per_gib"]) * 1.3
        report["ratio_time_ckptflow_vs_s5cmd"] = ck["wall_vs_s5cmd"]
        report["cpu_target_s_per_gib"] = round(cpu_target, 3)
        report["met"] = {"time_vs_s5cmd": ck["wall_vs_s5cmd"] <= 1.2, "peak_rss": ck["peak_rss_mib"] < 300,
                         "cpu_per_gib": ck["median_cpu_s_per_gib"] <= cpu_target}
    return report


if __name__ == "__main__":
    sys.exit(main())
