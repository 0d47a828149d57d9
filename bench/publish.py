"""Publication cost: ``ckptflow publish`` versus raw boto3 ``upload_file`` of the same files.

The artifact: a 1.5 GiB ``model.pt`` and 8 DCP shards (2 GiB in all). ckptflow's run includes
everything publication does — hashing every file, the create-once declaration, uploads with sha256
metadata, HEAD verification, the manifest commit and the receipt — in a child process whose own
peak RSS (VmHWM, sampled) is reported. The peer uploads the same files with ``upload_file`` at the
same concurrency (8) and part size, one file at a time, no hashing, also in a child process of its own
(both pay interpreter start-up). Runs are interleaved (``benchlib.interleaved``: a ``sync`` before
each step, the order reversed every other run), medians printed as JSON. Targets: time ratio ≤ 1.15,
publish peak RSS < 300 MiB.

    python bench/publish.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json
"""

from __future__ import annotations

import argparse
import json
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
from ckptflow.store import base
from ckptflow.store.credentials import load_credentials
from ckptflow.store.s3 import S3Store


def _publish_child(art: Path, bucket: str, creds: str, prefix: str) -> tuple[float, int]:
    elapsed, peak_kib, _ = run_child(["-m", "ckptflow", "publish", "--artifact-dir", str(art), "--upload-prefix", prefix,
                                      "--bucket", bucket, "--credentials", creds])
    return elapsed, peak_kib


def _raw_child(args: argparse.Namespace) -> int:
    """The peer: ``upload_file`` of each file, in a fresh interpreter like ckptflow's."""
    creds = load_credentials(args.credentials)
    raw = raw_client(creds, S3Store(args.bucket, creds))
    config = TransferConfig(
        multipart_threshold=base.DEFAULT_MULTIPART_THRESHOLD, multipart_chunksize=base.DEFAULT_PART_SIZE,
        max_concurrency=base.DEFAULT_CONCURRENCY,
    )
    art = Path(args.artifact)
    for rel in json.loads(args.paths):
        raw.upload_file(str(art / rel), args.bucket, f"{args.prefix}/{rel}", Config=config)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_artifact_args(ap)
    add_raw_child_args(ap, "--artifact", "--prefix")
    args = ap.parse_args()
    if args.raw_child:
        return _raw_child(args)

    creds = load_credentials(args.credentials)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    raw_t: list[float] = []
    ck_t: list[float] = []
    peak_kib = 0
    with scratch_bucket(creds, "publish") as store, tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        bucket = store.bucket
        art = make_artifact(Path(tmp), args.model_mib, args.shard_mib, args.shards)
        files = [p for p in sorted(art.rglob("*")) if p.is_file() and p.name != "optim.pt"]
        total = sum(p.stat().st_size for p in files)
        paths = json.dumps([str(p.relative_to(art)) for p in files])

        def raw_side(run: int) -> None:
            elapsed, _, _ = run_child([__file__, "--raw-child", "--credentials", args.credentials, "--bucket", bucket,
                                       "--paths", paths, "--artifact", str(art), "--prefix", f"raw/{run}"])
            raw_t.append(elapsed)

        def ckptflow_side(run: int) -> None:
            nonlocal peak_kib
            (art / ".uploaded").unlink(missing_ok=True)
            elapsed, peak = _publish_child(art, bucket, args.credentials, f"ck/{run}/checkpoints")
            ck_t.append(elapsed)
            peak_kib = max(peak_kib, peak)

        for run in range(args.runs):
            interleaved([partial(raw_side, run), partial(ckptflow_side, run)], run)
            print(f"run {run + 1}/{args.runs}: raw {raw_t[-1]:.2f}s ckptflow {ck_t[-1]:.2f}s", file=sys.stderr)
    raw_med, ck_med = statistics.median(raw_t), statistics.median(ck_t)
    report = {
        "artifact_mib": round(total / MiB),
        "runs": args.runs,
        "median_seconds": {"raw_boto3_upload_file": round(raw_med, 3), "ckptflow_publish": round(ck_med, 3)},
        "throughput_mib_s": {"raw": round(total / MiB / raw_med, 1), "ckptflow": round(total / MiB / ck_med, 1)},
        "ratio_time_ckptflow_vs_raw": round(ck_med / raw_med, 3),
        "publish_peak_rss_mib": round(peak_kib / 1024, 1),
        "targets": {"ratio_time": 1.15, "peak_rss_mib": 300},
    }
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
