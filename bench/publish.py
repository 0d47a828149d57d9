"""Publication cost: ``ckptflow publish`` versus raw boto3 ``upload_file`` of the same files.

The artifact: a 1.5 GiB ``model.pt`` and 8 DCP shards (2 GiB in all). ckptflow's run includes
everything publication does — hashing every file, the create-once declaration, uploads with sha256
metadata, HEAD verification, the manifest commit and the receipt — in a child process whose own
peak RSS (VmHWM, sampled) is reported. The peer uploads the same files with ``upload_file`` at the
same concurrency (8) and part size, one file at a time, no hashing, also in a child process of its own
(both pay interpreter start-up). Runs are interleaved (``benchlib.interleaved``: a ``sync`` before
each step, the order reversed every other run), medians printed as JSON. Targets: time ratio ≤ 1.15,
publish peak RSS < 300 MiB. The bulk-transfer peers (``peers.py``: s5cmd ``cp`` and rclone ``copy`` of
the artifact directory, when installed) upload the same files in the same rounds; the report gives each
tool's median wall time and client CPU seconds per GiB with ratios to s5cmd (target: publish ≤ 1.1×).

With ``--resume`` it measures instead what a killed publish costs: per run, a full publish of the
artifact to a fresh prefix, and a publish SIGKILLed once half of ``model.pt``'s parts are stored
(``CKPTFLOW_TEST_KILL_AT=upload:part-N-stored``) then run again; it reports the bytes each sent (the
report's ``sent_bytes``) and the rerun's wall time against the full one (its hashing pass included).

    python bench/publish.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json [--resume]

The 8 GiB figure (``--large``: a 6 GiB ``model.pt`` and 32 shards of 64 MiB; any shapes with
``--artifact``, repeatable, in the same rounds; raw boto3 runs only for artifacts of at most 2 GiB)
against s5cmd, target ≤ 1.05×; each upload is deleted after its step (untimed) and the server asked
to compact its volumes, so the rounds do not fill the disk. With ``--pin`` the server runs on CPU 0
and every client on CPU 1. Unpinned, then pinned (the bench servers as ``make bench`` starts them)::

    python tests/helpers/servers.py up --only seaweedfs --profile demo --root .ckptflow/bench-servers
    flock /tmp/bench.lock python bench/publish.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json --large
    flock /tmp/bench.lock python bench/publish.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json --large --pin
    python tests/helpers/servers.py down --root .ckptflow/bench-servers
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

from boto3.s3.transfer import TransferConfig

from benchlib import (
    MiB,
    Server,
    add_artifact_args,
    add_raw_child_args,
    artifact_shapes,
    interleaved,
    make_artifact,
    make_shaped,
    parse_shape,
    print_ratios,
    raw_client,
    run_child,
    run_measured,
    scratch_bucket,
)
from ckptflow.store import base
from ckptflow.store.credentials import load_credentials
from ckptflow.store.s3 import S3Store
from peers import GiB, Measured, Peers, table

TARGET_VS_S5CMD = 1.05
RAW_UP_TO = 2 * GiB  # raw boto3 runs for artifacts this size and smaller


def _raw_child(args: argparse.Namespace) -> int:
    """The peer: ``upload_file`` of each file, in a fresh interpreter like ckptflow's."""
    creds = load_credentials(args.credentials)
    raw = raw_client(creds, S3Store(args.bucket, creds))
    config = TransferConfig(
        multipart_threshold=base.DEFAULT_MULTIPART_THRESHOLD, multipart_chunksize=base.DEFAULT_PART_SIZE,
        max_concurrency=base.DEFAULT_CONCURRENCY,
    )
    art = Path(args.src)
    for rel in json.loads(args.paths):
        raw.upload_file(str(art / rel), args.bucket, f"{args.prefix}/{rel}", Config=config)
    return 0


def _resume_figures(args: argparse.Namespace, creds) -> dict:
    """Full publish versus the rerun of a publish killed at half of model.pt's parts."""
    full_t: list[float] = []
    rerun_t: list[float] = []
    full_sent = rerun_sent = reused = 0
    with scratch_bucket(creds, "resume") as store, tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        art = make_artifact(Path(tmp), args.model_mib, args.shard_mib, args.shards)
        parts = -(-(art / "model.pt").stat().st_size // base.DEFAULT_PART_SIZE)
        env = {"CKPTFLOW_CACHE_DIR": str(Path(tmp) / "cache")}

        def publish(prefix: str) -> list[str]:
            (art / ".uploaded").unlink(missing_ok=True)
            return ["-m", "ckptflow", "publish", "--artifact-dir", str(art), "--upload-prefix", prefix,
                    "--bucket", store.bucket, "--credentials", args.credentials]

        for run in range(args.runs):
            subprocess.run(["sync"], check=False)
            elapsed, _, out = run_child(publish(f"full/{run}/checkpoints"), env=env)
            full_t.append(elapsed)
            full_sent = json.loads(out)["sent_bytes"]
            killed = subprocess.run([sys.executable, *publish(f"resume/{run}/checkpoints")], capture_output=True,
                                    env={**os.environ, "CKPTFLOW_PROGRESS": "0", **env,
                                         "CKPTFLOW_TEST_KILL_AT": f"upload:part-{parts // 2}-stored"})
            if killed.returncode != -signal.SIGKILL:
                raise SystemExit(f"the publish to be killed ended with {killed.returncode}: {killed.stderr[-2000:]}")
            subprocess.run(["sync"], check=False)
            elapsed, _, out = run_child(publish(f"resume/{run}/checkpoints"), env=env)
            rerun_t.append(elapsed)
            report = json.loads(out)
            rerun_sent, reused = report["sent_bytes"], sum(r["reused_bytes"] for r in report["resumed_uploads"])
            print(f"run {run + 1}/{args.runs}: full {full_t[-1]:.2f}s, rerun after kill {rerun_t[-1]:.2f}s",
                  file=sys.stderr)
    full_med, rerun_med = statistics.median(full_t), statistics.median(rerun_t)
    return {
        "artifact_mib": round(full_sent / MiB), "model_parts": parts, "killed_after_part": parts // 2, "runs": args.runs,
        "full_publish": {"median_seconds": round(full_med, 3), "sent_mib": round(full_sent / MiB, 1)},
        "rerun_after_kill": {"median_seconds": round(rerun_med, 3), "sent_mib": round(rerun_sent / MiB, 1),
                             "reused_mib": round(reused / MiB, 1)},
        "ratio_time_rerun_vs_full": round(rerun_med / full_med, 3),
        "ratio_bytes_rerun_vs_full": round(rerun_sent / full_sent, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_artifact_args(ap)
    add_raw_child_args(ap, "--src", "--prefix")
    ap.add_argument("--resume", action="store_true",
                    help="measure the rerun of a publish killed at half of model.pt's parts against a full publish")
    args = ap.parse_args()
    if args.raw_child:
        return _raw_child(args)
    if args.resume:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
        print(json.dumps(_resume_figures(args, load_credentials(args.credentials)), indent=2, sort_keys=True))
        return 0

    shapes = args.artifact or ([parse_shape("8g")] if args.large else artifact_shapes(args))
    creds = load_credentials(args.credentials)
    server = Server(args.credentials)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, list[Measured]]] = []
    totals: list[int] = []
    with scratch_bucket(creds, "publish") as store, tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        bucket = store.bucket
        peers = Peers(creds, Path(tmp))
        arts = []
        for index, shape in enumerate(shapes):
            art = make_shaped(Path(tmp) / f"src{index}", shape)
            files = [p for p in sorted(art.rglob("*")) if p.is_file() and p.name != "optim.pt"]
            totals.append(sum(p.stat().st_size for p in files))
            runs.append({"ckptflow": [], **({"raw_boto3": []} if shape.nbytes <= RAW_UP_TO else {}),
                         **{name: [] for name in peers.tools}})
            arts.append((art, json.dumps([str(p.relative_to(art)) for p in files])))

        def removed(prefix: str) -> None:
            # Untimed: the upload goes, and the server compacts its volumes so the space comes back.
            for obj in store.list(prefix):
                store.delete(obj.key)
            server.vacuum()

        def raw_side(index: int, run: int) -> None:
            art, paths = arts[index]
            runs[index]["raw_boto3"].append(run_measured([__file__, "--raw-child", "--credentials", args.credentials,
                                                          "--bucket", bucket, "--paths", paths, "--src", str(art),
                                                          "--prefix", f"s{index}/raw/{run}"]))
            removed(f"s{index}/raw/{run}/")

        def ckptflow_side(index: int, run: int) -> None:
            art = arts[index][0]
            (art / ".uploaded").unlink(missing_ok=True)
            runs[index]["ckptflow"].append(run_measured(["-m", "ckptflow", "publish", "--artifact-dir", str(art),
                                                         "--upload-prefix", f"s{index}/ck/{run}/checkpoints",
                                                         "--bucket", bucket, "--credentials", args.credentials]))
            removed(f"s{index}/ck/{run}/")

        def peer_side(index: int, name: str, run: int) -> None:
            art = arts[index][0]
            (art / ".uploaded").unlink(missing_ok=True)  # the peers copy the artifact's files, as ckptflow does
            runs[index][name].append(peers.upload(name, art, bucket, f"s{index}/{name}/{run}"))
            removed(f"s{index}/{name}/{run}/")

        with server.pinned(args.pin):
            for run in range(args.runs):
                steps = []
                for index, got in enumerate(runs):
                    steps += [partial(ckptflow_side, index, run), *(partial(peer_side, index, name, run)
                                                                     for name in peers.tools)]
                    if "raw_boto3" in got:
                        steps.append(partial(raw_side, index, run))
                interleaved(steps, run)
                for shape, got in zip(shapes, runs, strict=True):
                    print(f"run {run + 1}/{args.runs} {shape.label}: "
                          + ", ".join(f"{k} {v[-1].wall:.2f}s {v[-1].cpu:.2f} CPU-s" for k, v in got.items()),
                          file=sys.stderr)
    reports, ratios = [], []
    for shape, got, total in zip(shapes, runs, totals, strict=True):
        rows = table(got, total)
        ck = rows["ckptflow"]
        report = {
            "artifact": shape.label,
            "artifact_mib": round(total / MiB),
            "tools": rows,
            "publish_peak_rss_mib": ck["peak_rss_mib"],
            "targets": {"ratio_time_vs_raw": 1.15, "ratio_time_vs_s5cmd": TARGET_VS_S5CMD, "peak_rss_mib": 300},
        }
        if "raw_boto3" in rows:
            report["ratio_time_ckptflow_vs_raw"] = round(ck["median_wall_s"] / rows["raw_boto3"]["median_wall_s"], 3)
            ratios.append((f"publish {shape.label}: wall ckptflow / raw boto3", report["ratio_time_ckptflow_vs_raw"],
                           "<= 1.15"))
        if "s5cmd" in rows:
            report["ratio_time_ckptflow_vs_s5cmd"] = ck["wall_vs_s5cmd"]
            report["met"] = {"time_vs_s5cmd": ck["wall_vs_s5cmd"] <= TARGET_VS_S5CMD, "peak_rss": ck["peak_rss_mib"] < 300}
            ratios += [(f"publish {shape.label}: wall {name} / s5cmd", row["wall_vs_s5cmd"],
                        f"<= {TARGET_VS_S5CMD}" if name == "ckptflow" else None)
                       for name, row in rows.items() if name != "s5cmd"]
        ratios += [(f"publish {shape.label}: CPU-s per GiB {name}", row["median_cpu_s_per_gib"], None)
                   for name, row in rows.items()]
        reports.append(report)
    print(json.dumps({"runs": args.runs, "pinned": args.pin, "notes": peers.notes, "artifacts": reports},
                     indent=2, sort_keys=True), flush=True)
    print_ratios(ratios, f"publish ({'pinned' if args.pin else 'unpinned'}), medians of {args.runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
