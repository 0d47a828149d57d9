"""Scrub cost: ``ckptflow verify --read-data`` versus ``ckptflow fetch`` of the same artifact.

The artifact is bench/fetch.py's (a 1.5 GiB ``model.pt`` and 8 DCP shards of 64 MiB by default),
published once with ckptflow; its payloads are then removed locally (the manifest and receipt stay,
as after ``prune-verified``), so no page cache holds a source copy. Both sides are the real command in
a child process: the scrub reads every object back through fetch's concurrent ranged GETs and hashes
the ranges as they arrive, writing nothing; fetch does the same and writes every byte (``.part``
files, flushed, renamed). Fetch is measured durable (its default) and without flushing payloads
(``CKPTFLOW_FSYNC=0``). Runs are interleaved (``benchlib.interleaved``), medians printed as JSON.
Target: the scrub's time ≤ 0.9 × fetch's (durable).

    python bench/scrub.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from functools import partial
from pathlib import Path

from benchlib import MiB, add_artifact_args, interleaved, make_artifact, run_measured, scratch_bucket
from ckptflow.archive.publish import publish_artifact
from ckptflow.records import receipt as receipt_record
from ckptflow.store.credentials import load_credentials
from peers import Measured, table

UPLOAD_PREFIX = "bench/run/20260101T000000Z/checkpoints"
ARTIFACT_PREFIX = "bench/run/20260101T000000Z/checkpoint_artifacts/iter_000001"
TARGET = 0.9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_artifact_args(ap)
    args = ap.parse_args()

    creds = load_credentials(args.credentials)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Measured]] = {"scrub": [], "fetch": [], "fetch_nofsync": []}
    with scratch_bucket(creds, "scrub") as store, tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        art = make_artifact(Path(tmp), args.model_mib, args.shard_mib, args.shards)
        publish_artifact(art, store, UPLOAD_PREFIX, progress=False)
        files = receipt_record.read_receipt(art).files
        for name in ("model.pt", "optim"):  # as after prune-verified: only the records stay
            target = art / name
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        total = sum(f.size for f in files)
        uri = f"s3://{store.bucket}/{ARTIFACT_PREFIX}"

        def scrub_side() -> None:
            got = run_measured(["-m", "ckptflow", "verify", "--artifact-dir", str(art), "--read-data",
                                "--credentials", args.credentials])
            report = json.loads(got.out)
            assert report["status"] == "verified" and report["bytes_read"] >= total, report
            runs["scrub"].append(got)

        def fetch_side(run: int, fsync: bool) -> None:
            stage = Path(tmp) / f"stage-{run}"
            got = run_measured(["-m", "ckptflow", "fetch", "--artifact-uri", uri, "--dst", str(stage),
                                "--credentials", args.credentials], env={} if fsync else {"CKPTFLOW_FSYNC": "0"})
            assert json.loads(got.out)["status"] == "fetched", got.out
            runs["fetch" if fsync else "fetch_nofsync"].append(got)
            shutil.rmtree(stage)

        for run in range(args.runs):
            interleaved([scrub_side, partial(fetch_side, run, True), partial(fetch_side, run, False)], run)
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1].wall:.2f}s {v[-1].cpu:.2f} CPU-s"
                                                             for k, v in runs.items()), file=sys.stderr)
    rows = table(runs, total)
    ratio = rows["scrub"]["median_wall_s"] / rows["fetch"]["median_wall_s"]
    print(json.dumps({
        "artifact_mib": round(total / MiB),
        "runs": args.runs,
        "tools": rows,
        "ratio_time_scrub_vs_fetch": round(ratio, 3),
        "ratio_time_scrub_vs_fetch_nofsync": round(rows["scrub"]["median_wall_s"] / rows["fetch_nofsync"]["median_wall_s"], 3),
        "scrub_peak_rss_mib": rows["scrub"]["peak_rss_mib"],
        "targets": {"ratio_time_scrub_vs_fetch": TARGET},
        "met": {"ratio_time_scrub_vs_fetch": ratio <= TARGET},
    }, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
