"""Fetch cost: ``ckptflow fetch`` versus s5cmd and rclone (and raw boto3) on the same objects, same rounds.

Each artifact (``--artifact``, repeatable; ``--large``: ``2g`` and ``8g`` in the same rounds) is
published once with ckptflow: ``2g`` is a 1.5 GiB ``model.pt`` and 8 DCP shards of 64 MiB, ``8g`` a
6 GiB ``model.pt`` and 32 shards of 64 MiB. ckptflow's run is the real command in a child process
(reading and validating the declaration and manifest, HEAD checks, downloads through ``.part`` files
verified while written, renames, the staging record), durable (every payload fsynced before it
commits). The bulk-transfer peers (``peers.py``: s5cmd ``cp`` and rclone ``copy`` of the prefix, when
installed) are made durable too: their copies are fsynced (``sync FILE...``) inside their timing, so
both sides pay the flush. For artifacts of at most 2 GiB the report also gives raw boto3
``download_file`` (concurrency 8, 8 MiB chunks, one file at a time, no hashing, no fsync, in a child of
its own) and ckptflow with ``CKPTFLOW_FSYNC=0``. Rounds are interleaved (``benchlib.interleaved``: a
``sync`` before each step, the order reversed every other round); medians of ``--runs``.

For every tool the report gives the median wall time, the median client CPU seconds per GiB (the
child's own, from ``wait4``) and both as ratios to s5cmd; targets: wall ≤ 1.0× s5cmd, client CPU per
GiB ≤ 1.2× s5cmd's, fetch peak RSS < 300 MiB (printed, not asserted). The ratios end the output as a
table on stderr after the JSON on stdout.

With ``--pin`` the server runs on CPU 0 (``taskset -a -p``) and every client on CPU 1 (``taskset -c``).
The figures, unpinned then pinned (the bench servers as ``make bench`` starts them)::

    python tests/helpers/servers.py up --only seaweedfs --profile demo --root .ckptflow/bench-servers
    flock /tmp/bench.lock python bench/fetch.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json --large
    flock /tmp/bench.lock python bench/fetch.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json --large --pin
    python tests/helpers/servers.py down --root .ckptflow/bench-servers
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
    Server,
    Shape,
    add_artifact_args,
    add_raw_child_args,
    artifact_shapes,
    interleaved,
    make_shaped,
    parse_shape,
    print_ratios,
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
from peers import GiB, Measured, Peers, sha256_cpu_per_gib, table

EXTRAS_UP_TO = 2 * GiB  # raw boto3 and ckptflow without fsync run for artifacts this size and smaller


def prefixes(index: int) -> tuple[str, str]:
    """The upload prefix and the artifact's prefix of the ``index``-th artifact of a run."""
    run = f"bench{index}/run/20260101T000000Z"
    return f"{run}/checkpoints", f"{run}/checkpoint_artifacts/iter_000001"


def _raw_child(args: argparse.Namespace) -> int:
    """The peer: ``download_file`` of each object, largest first, in a fresh interpreter like ckptflow's."""
    creds = load_credentials(args.credentials)
    raw = raw_client(creds, S3Store(args.bucket, creds))
    transfer = TransferConfig(multipart_threshold=DEFAULT_RANGE_SIZE, multipart_chunksize=DEFAULT_RANGE_SIZE,
                              max_concurrency=base.DEFAULT_CONCURRENCY)
    out = Path(args.out)
    for rel in json.loads(args.paths):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        raw.download_file(args.bucket, f"{args.prefix}/{rel}", str(out / rel), Config=transfer)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_artifact_args(ap)
    add_raw_child_args(ap, "--out", "--prefix")
    args = ap.parse_args()
    if args.raw_child:
        return _raw_child(args)

    shapes = args.artifact or ([parse_shape("2g"), parse_shape("8g")] if args.large else artifact_shapes(args))
    creds = load_credentials(args.credentials)
    server = Server(args.credentials)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, list[Measured]]] = []
    totals: list[int] = []
    with scratch_bucket(creds, "fetch") as store, tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        bucket = store.bucket
        peers = Peers(creds, Path(tmp), durable=True)
        steps = []
        for index, shape in enumerate(shapes):
            upload_prefix, prefix = prefixes(index)
            art = make_shaped(Path(tmp) / f"src{index}", shape)
            publish_artifact(art, store, upload_prefix, progress=False)
            shutil.rmtree(art.parent.parent)  # only the archive remains: page cache holds no source copy
            declared = declaration_record.parse_declaration(store.get_bytes(f"{prefix}/.posttrain-archive.json"))
            # The payloads: fetch writes the records (manifest, part digests) from what it already read.
            files = [e for e in declared.files if not Path(e.path).name.startswith(".posttrain-")]
            total = sum(e.size for e in files)
            extras = shape.nbytes <= EXTRAS_UP_TO
            got: dict[str, list[Measured]] = {"ckptflow": [], **{name: [] for name in peers.tools}}
            if extras:
                got.update({"raw_boto3": [], "ckptflow_nofsync": []})
            runs.append(got)
            totals.append(total)
            steps.append((index, prefix, total, json.dumps([e.path for e in sorted(files, key=lambda e: -e.size)]),
                          extras))

        def raw_side(index: int, prefix: str, paths: str, run: int) -> None:
            out = Path(tmp) / f"raw-{index}-{run}"
            runs[index]["raw_boto3"].append(run_measured([__file__, "--raw-child", "--credentials", args.credentials,
                                                          "--bucket", bucket, "--prefix", prefix, "--paths", paths,
                                                          "--out", str(out)]))
            shutil.rmtree(out)

        def ckptflow_side(index: int, prefix: str, total: int, run: int, fsync: bool) -> None:
            stage = Path(tmp) / f"stage-{index}-{run}"
            env = {} if fsync else {"CKPTFLOW_FSYNC": "0"}
            got = run_measured(["-m", "ckptflow", "fetch", "--artifact-uri", f"s3://{bucket}/{prefix}",
                                "--dst", str(stage), "--credentials", args.credentials], env=env)
            report = json.loads(got.out)
            assert report["status"] == "fetched" and report["downloaded_bytes"] == total, report
            runs[index]["ckptflow" if fsync else "ckptflow_nofsync"].append(got)
            shutil.rmtree(stage)

        def peer_side(index: int, prefix: str, total: int, name: str, run: int) -> None:
            out = Path(tmp) / f"{name}-{index}-{run}"
            runs[index][name].append(peers.download(name, bucket, prefix, out))
            got = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            assert got >= total, f"{name} downloaded {got} bytes, fewer than the artifact's {total}"
            shutil.rmtree(out)

        with server.pinned(args.pin):
            for run in range(args.runs):
                round_steps = []
                for index, prefix, total, paths, extras in steps:
                    round_steps += [partial(ckptflow_side, index, prefix, total, run, True),
                                    *(partial(peer_side, index, prefix, total, name, run) for name in peers.tools)]
                    if extras:
                        round_steps += [partial(raw_side, index, prefix, paths, run),
                                        partial(ckptflow_side, index, prefix, total, run, False)]
                interleaved(round_steps, run)
                for shape, got in zip(shapes, runs, strict=True):
                    print(f"run {run + 1}/{args.runs} {shape.label}: "
                          + ", ".join(f"{k} {v[-1].wall:.2f}s {v[-1].cpu:.2f} CPU-s" for k, v in got.items()),
                          file=sys.stderr)
            sha_cpu = sha256_cpu_per_gib()
    reports = [report_of(shape, got, total, sha_cpu) for shape, got, total in zip(shapes, runs, totals, strict=True)]
    print(json.dumps({"runs": args.runs, "pinned": args.pin, "notes": peers.notes, "sha256_cpu_s_per_gib": round(sha_cpu, 3),
                      "artifacts": reports}, indent=2, sort_keys=True), flush=True)
    rows = []
    for report in reports:
        for row in report["ratios"]:
            rows.append((f"fetch {report['artifact']}: {row['figure']}", row["value"], row["target"]))
    print_ratios(rows, f"fetch ({'pinned' if args.pin else 'unpinned'}), medians of {args.runs}")
    return 0


def report_of(shape: Shape, runs: dict[str, list[Measured]], total: int, sha_cpu: float) -> dict:
    rows = table(runs, total)
    ck = rows["ckptflow"]
    report: dict = {
        "artifact": shape.label,
        "artifact_mib": round(total / MiB),
        "tools": rows,
        "fetch_peak_rss_mib": ck["peak_rss_mib"],
        "targets": {"ratio_time_vs_s5cmd": 1.0, "ratio_cpu_per_gib_vs_s5cmd": 1.2, "peak_rss_mib": 300},
    }
    ratios: list[tuple[str, float | None, object]] = []
    if "raw_boto3" in rows:
        raw_med = rows["raw_boto3"]["median_wall_s"]
        report["ratio_time_ckptflow_vs_raw"] = round(ck["median_wall_s"] / raw_med, 3)
        report["ratio_time_ckptflow_nofsync_vs_raw"] = round(rows["ckptflow_nofsync"]["median_wall_s"] / raw_med, 3)
        report["raw_peak_rss_mib"] = rows["raw_boto3"]["peak_rss_mib"]
        ratios.append(("wall ckptflow / raw boto3 (no fsync)", report["ratio_time_ckptflow_vs_raw"], None))
    if "s5cmd" in rows:
        report["ratio_time_ckptflow_vs_s5cmd"] = ck["wall_vs_s5cmd"]
        report["ratio_cpu_per_gib_ckptflow_vs_s5cmd"] = ck["cpu_vs_s5cmd"]
        report["met"] = {"time_vs_s5cmd": ck["wall_vs_s5cmd"] <= 1.0, "peak_rss": ck["peak_rss_mib"] < 300,
                         "cpu_per_gib_vs_s5cmd": ck["cpu_vs_s5cmd"] <= 1.2}
        for name in rows:
            if name != "s5cmd":
                ratios.append((f"wall {name} / s5cmd", rows[name]["wall_vs_s5cmd"], "<= 1.0" if name == "ckptflow" else None))
        for name in rows:
            if name != "s5cmd":
                ratios.append((f"CPU/GiB {name} / s5cmd", rows[name]["cpu_vs_s5cmd"], "<= 1.2" if name == "ckptflow" else None))
    for name, row in rows.items():
        ratios.append((f"CPU-s per GiB {name}", row["median_cpu_s_per_gib"], None))
    ratios.append(("one SHA-256 pass, CPU-s per GiB", round(sha_cpu, 3), None))
    report["ratios"] = [{"figure": name, "value": value, "target": target} for name, value, target in ratios]
    return report


if __name__ == "__main__":
    sys.exit(main())
