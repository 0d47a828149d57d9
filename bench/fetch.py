"""Fetch cost: ``ckptflow fetch`` versus raw boto3 ``download_file`` of the same objects.

The artifact: a 1.5 GiB ``model.pt`` and 8 DCP shards of 64 MiB (2 GiB in all), published once with
ckptflow. ckptflow's run is the real command in a child process (reading and validating the
declaration and manifest, HEAD checks, downloads through ``.part`` files hashed while written, the
size + sha256 check, renames, the staging record) and its peak RSS is reported. The peer downloads the
same objects with ``download_file`` at the same concurrency (8) and chunk size (8 MiB), one file at a
time, no hashing, no fsync, also in a child process of its own (both pay interpreter start-up; each
side's peak RSS is its own ``VmHWM``). Runs are interleaved (``benchlib.interleaved``: a ``sync``
before each step, the order reversed every other run), medians printed as JSON. Targets: time ratio ≤ 1.10, fetch
peak RSS < 300 MiB (printed, not asserted).

    python bench/fetch.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
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
    run_child,
    scratch_bucket,
)
from ckptflow.archive.publish import publish_artifact
from ckptflow.records import declaration as declaration_record
from ckptflow.store import base
from ckptflow.store.credentials import load_credentials
from ckptflow.store.s3 import S3Store
from ckptflow.store.transfer import DEFAULT_RANGE_SIZE

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
    raw_t: list[float] = []
    ck_t: list[float] = []
    nofsync_t: list[float] = []
    peaks: dict[str, int] = {"raw": 0, "ckptflow": 0}
    with scratch_bucket(creds, "fetch") as store, tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        bucket = store.bucket
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
            elapsed, peak, _ = run_child([__file__, "--raw-child", "--credentials", args.credentials, "--bucket", bucket,
                                          "--paths", paths, "--out", str(out)])
            raw_t.append(elapsed)
            peaks["raw"] = max(peaks["raw"], peak)
            shutil.rmtree(out)

        def ckptflow_side(run: int, fsync: bool) -> None:
            # Without flushing payloads (CKPTFLOW_FSYNC=0, scratch staging) is the like-for-like
            # comparison, since raw boto3 never flushes; the default is durable.
            stage = Path(tmp) / f"stage-{run}"
            env = {} if fsync else {"CKPTFLOW_FSYNC": "0"}
            elapsed, peak, stdout = run_child(["-m", "ckptflow", "fetch", "--artifact-uri", uri, "--dst", str(stage),
                                               "--credentials", args.credentials], env=env)
            report = json.loads(stdout)
            assert report["status"] == "fetched" and report["downloaded_bytes"] == total, report
            (ck_t if fsync else nofsync_t).append(elapsed)
            peaks["ckptflow"] = max(peaks["ckptflow"], peak)
            shutil.rmtree(stage)

        for run in range(args.runs):
            interleaved([partial(raw_side, run), partial(ckptflow_side, run, True), partial(ckptflow_side, run, False)], run)
            print(f"run {run + 1}/{args.runs}: raw {raw_t[-1]:.2f}s ckptflow {ck_t[-1]:.2f}s "
                  f"(no fsync {nofsync_t[-1]:.2f}s)", file=sys.stderr)
    raw_med, ck_med = statistics.median(raw_t), statistics.median(ck_t)
    report = {
        "artifact_mib": round(total / MiB),
        "runs": args.runs,
        "median_seconds": {"raw_boto3_download_file": round(raw_med, 3), "ckptflow_fetch": round(ck_med, 3)},
        "throughput_mib_s": {"raw": round(total / MiB / raw_med, 1), "ckptflow": round(total / MiB / ck_med, 1)},
        "ratio_time_ckptflow_vs_raw": round(ck_med / raw_med, 3),
        "ratio_time_ckptflow_nofsync_vs_raw": round(statistics.median(nofsync_t) / raw_med, 3),
        "fetch_peak_rss_mib": round(peaks["ckptflow"] / 1024, 1),
        "raw_peak_rss_mib": round(peaks["raw"] / 1024, 1),
        "targets": {"ratio_time": 1.10, "peak_rss_mib": 300},
    }
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
