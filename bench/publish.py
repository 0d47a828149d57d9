"""Publication cost: ``ckptflow publish`` versus raw boto3 ``upload_file`` of the same files.

The artifact: a 1.5 GiB ``model.pt`` and 8 DCP shards (2 GiB in all). ckptflow's run includes
everything publication does — hashing every file, the create-once declaration, uploads with sha256
metadata, HEAD verification, the manifest commit and the receipt — in a child process whose own
peak RSS (VmHWM, sampled) is reported. The peer uploads the same files with ``upload_file`` at the same concurrency (8) and
part size, no hashing. Runs are interleaved, medians printed as JSON. Targets: time ratio ≤ 1.15,
publish peak RSS < 300 MiB.

    python bench/publish.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from boto3.s3.transfer import TransferConfig

from benchlib import MiB, add_artifact_args, make_artifact, raw_client, run_child
from ckptflow.store import base
from ckptflow.store.credentials import load_credentials
from ckptflow.store.s3 import S3Store


def _publish_child(art: Path, bucket: str, creds: str, prefix: str) -> tuple[float, int]:
    elapsed, peak_kib, _ = run_child(["-m", "ckptflow", "publish", "--artifact-dir", str(art), "--upload-prefix", prefix,
                                      "--bucket", bucket, "--credentials", creds])
    return elapsed, peak_kib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_artifact_args(ap)
    args = ap.parse_args()

    creds = load_credentials(args.credentials)
    bucket = f"bench-publish-{uuid.uuid4().hex[:8]}"
    store = S3Store(bucket, creds)
    store.ensure_bucket()
    raw = raw_client(creds, store.boto_config)
    config = TransferConfig(
        multipart_threshold=base.DEFAULT_MULTIPART_THRESHOLD, multipart_chunksize=base.DEFAULT_PART_SIZE,
        max_concurrency=base.DEFAULT_CONCURRENCY,
    )
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    raw_t: list[float] = []
    ck_t: list[float] = []
    peak_kib = 0
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        art = make_artifact(Path(tmp), args.model_mib, args.shard_mib, args.shards)
        files = [p for p in sorted(art.rglob("*")) if p.is_file() and p.name != "optim.pt"]
        total = sum(p.stat().st_size for p in files)
        for run in range(args.runs):
            t = time.perf_counter()
            for p in files:
                raw.upload_file(str(p), bucket, f"raw/{run}/{p.relative_to(art)}", Config=config)
            raw_t.append(time.perf_counter() - t)

            (art / ".uploaded").unlink(missing_ok=True)
            elapsed, peak = _publish_child(art, bucket, args.credentials, f"ck/{run}/checkpoints")
            ck_t.append(elapsed)
            peak_kib = max(peak_kib, peak)
            print(f"run {run + 1}/{args.runs}: raw {raw_t[-1]:.2f}s ckptflow {elapsed:.2f}s", file=sys.stderr)
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
