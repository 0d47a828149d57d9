"""Scrub cost: ``ckptflow verify --read-data`` versus ``ckptflow fetch`` of the same artifact, and the
verification throughput of one large file against the hashing threads.

Each artifact (``--artifact``, repeatable; default bench/fetch.py's 2 GiB shape, ``--large``: ``8g``, a
6 GiB ``model.pt`` and 32 DCP shards of 64 MiB) is published once with ckptflow; its payloads are then
removed locally (the manifest and receipt stay, as after ``prune-verified``), so no page cache holds a
source copy. Both sides are the real command in a child process: the scrub reads every object back
through fetch's concurrent ranged GETs and checks the ranges as they arrive, writing nothing; fetch
does the same and writes every byte (``.part`` files, flushed, renamed). Fetch is measured durable
(its default) and without flushing payloads (``CKPTFLOW_FSYNC=0``). Beside them, the read with nothing
checked or written: ``s5cmd cat`` of the artifact's prefix into /dev/null (what the server and the
connection deliver; no verified read can be faster, so scrub / s5cmd cat near 1 means the scrub runs at
the server's rate). Targets: the scrub's time ≤ 0.6 ×
fetch's (durable), the scrub's client CPU ≤ 0.5 s per GiB.

The one-file figure: an artifact that is one large ``model.pt`` (``--one-file``, default 1536 MiB;
``--large``: ``6g-one``, 6 GiB) scrubbed with ``CKPTFLOW_HASH_THREADS`` set to each of
``--hash-threads`` (1,2), in the same rounds: GiB/s of the whole command (start-up, HEADs and reads
included) and its CPU per GiB. Beside it, the in-process hash rates on this machine (SHA-256 on one
core, BLAKE3 on 1 and 2 threads, 512 MiB in memory) and the cores they need to verify at 25 and
100 Gb/s (``peers.cores_model``). Pinned, the client has one core, so ckptflow caps its hashing at
one thread (``digest.hash_threads``) whatever ``CKPTFLOW_HASH_THREADS`` says.

Rounds are interleaved (``benchlib.interleaved``: a ``sync`` before each step, the order reversed every
other round), medians of ``--runs`` printed as JSON, then the ratios as a table on stderr. With
``--pin`` the server runs on CPU 0 and every client on CPU 1. The figures, unpinned then pinned::

    python tests/helpers/servers.py up --only seaweedfs --profile demo --root .ckptflow/bench-servers
    flock /tmp/bench.lock python bench/scrub.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json --large
    flock /tmp/bench.lock python bench/scrub.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json --large --pin
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

from benchlib import (
    MiB,
    Server,
    add_artifact_args,
    artifact_shapes,
    interleaved,
    make_shaped,
    parse_shape,
    print_ratios,
    run_measured,
    scratch_bucket,
)
from ckptflow.archive.publish import publish_artifact
from ckptflow.records import receipt as receipt_record
from ckptflow.store.credentials import load_credentials
from peers import GiB, Measured, Peers, cores_model, hash_rates, table

TARGET = 0.6
CPU_TARGET = 0.5  # verify --read-data, client CPU-s per GiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_artifact_args(ap)
    ap.add_argument("--one-file", type=parse_shape, default=None,
                    help="the one-file artifact's shape (default 1536, with --large 6g-one); 0: none")
    ap.add_argument("--hash-threads", default="1,2", help="the CKPTFLOW_HASH_THREADS values of the one-file scrub")
    args = ap.parse_args()
    shapes = args.artifact or ([parse_shape("8g")] if args.large else artifact_shapes(args))
    one = args.one_file or parse_shape("6g-one" if args.large else "1536")
    threads = [int(t) for t in args.hash_threads.split(",") if t]

    creds = load_credentials(args.credentials)
    server = Server(args.credentials)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, list[Measured]]] = []
    totals: list[int] = []
    one_runs: dict[str, list[Measured]] = {f"hash_threads_{n}": [] for n in threads} if one.model_mib else {}
    one_total = 0
    with scratch_bucket(creds, "scrub") as store, tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        published = []
        for index, shape in enumerate([*shapes, *([one] if one_runs else [])]):
            art = make_shaped(Path(tmp) / f"src{index}", shape)
            publish_artifact(art, store, f"bench{index}/run/20260101T000000Z/checkpoints", progress=False)
            files = receipt_record.read_receipt(art).files
            for name in ("model.pt", "optim"):  # as after prune-verified: only the records stay
                target = art / name
                shutil.rmtree(target) if target.is_dir() else target.unlink()
            uri = f"s3://{store.bucket}/bench{index}/run/20260101T000000Z/checkpoint_artifacts/iter_000001"
            published.append((art, uri, sum(f.size for f in files)))
        peers = Peers(creds, Path(tmp))
        reader = "s5cmd" in peers.tools  # the unverified read: what the server delivers
        if one_runs:
            one_art, _, one_total = published.pop()
        for _, _, total in published:
            runs.append({"scrub": [], "fetch": [], "fetch_nofsync": [], **({"s5cmd_cat": []} if reader else {})})
            totals.append(total)

        def scrub(art: Path, total: int, into: list[Measured], env: dict[str, str] | None = None) -> None:
            got = run_measured(["-m", "ckptflow", "verify", "--artifact-dir", str(art), "--read-data",
                                "--credentials", args.credentials], env=env)
            report = json.loads(got.out)
            assert report["status"] == "verified" and report["bytes_read"] >= total, report
            into.append(got)

        def fetch(index: int, uri: str, run: int, fsync: bool) -> None:
            stage = Path(tmp) / f"stage-{index}-{run}"
            got = run_measured(["-m", "ckptflow", "fetch", "--artifact-uri", uri, "--dst", str(stage),
                                "--credentials", args.credentials], env={} if fsync else {"CKPTFLOW_FSYNC": "0"})
            assert json.loads(got.out)["status"] == "fetched", got.out
            runs[index]["fetch" if fsync else "fetch_nofsync"].append(got)
            shutil.rmtree(stage)

        def read_raw(index: int, uri: str) -> None:
            bucket, prefix = uri.removeprefix("s3://").split("/", 1)
            runs[index]["s5cmd_cat"].append(peers.read(bucket, prefix))

        with server.pinned(args.pin):
            for run in range(args.runs):
                steps = []
                for index, (art, uri, total) in enumerate(published):
                    steps += [partial(scrub, art, total, runs[index]["scrub"]), partial(fetch, index, uri, run, True),
                              partial(fetch, index, uri, run, False), *([partial(read_raw, index, uri)] if reader else [])]
                steps += [partial(scrub, one_art, one_total, one_runs[f"hash_threads_{n}"],
                                  {"CKPTFLOW_HASH_THREADS": str(n)}) for n in threads if one_runs]
                interleaved(steps, run)
                for shape, got in [*zip(shapes, runs, strict=True), *([(one, one_runs)] if one_runs else [])]:
                    print(f"run {run + 1}/{args.runs} {shape.label}: "
                          + ", ".join(f"{k} {v[-1].wall:.2f}s {v[-1].cpu:.2f} CPU-s" for k, v in got.items()),
                          file=sys.stderr)
            rates = hash_rates()
    reports, rows = [], []
    for shape, got, total in zip(shapes, runs, totals, strict=True):
        tools = table(got, total, reference="s5cmd_cat" if "s5cmd_cat" in got else "fetch")
        ratio = tools["scrub"]["median_wall_s"] / tools["fetch"]["median_wall_s"]
        raw = tools["scrub"]["median_wall_s"] / tools["s5cmd_cat"]["median_wall_s"] if "s5cmd_cat" in got else None
        cpu = tools["scrub"]["median_cpu_s_per_gib"]
        reports.append({
            "artifact": shape.label,
            "artifact_mib": round(total / MiB),
            "tools": tools,
            "ratio_time_scrub_vs_fetch": round(ratio, 3),
            "ratio_time_scrub_vs_fetch_nofsync": round(tools["scrub"]["median_wall_s"]
                                                       / tools["fetch_nofsync"]["median_wall_s"], 3),
            "ratio_time_scrub_vs_s5cmd_cat": None if raw is None else round(raw, 3),
            "scrub_cpu_s_per_gib": cpu,
            "scrub_peak_rss_mib": tools["scrub"]["peak_rss_mib"],
            "targets": {"ratio_time_scrub_vs_fetch": TARGET, "scrub_cpu_s_per_gib": CPU_TARGET},
            "met": {"ratio_time_scrub_vs_fetch": ratio <= TARGET, "scrub_cpu_s_per_gib": cpu <= CPU_TARGET},
        })
        rows += [(f"scrub {shape.label}: wall scrub / fetch", round(ratio, 3), f"<= {TARGET}"),
                 (f"scrub {shape.label}: wall scrub / fetch (no fsync)",
                  reports[-1]["ratio_time_scrub_vs_fetch_nofsync"], None),
                 *([(f"scrub {shape.label}: wall scrub / s5cmd cat (unverified, nothing written)", round(raw, 3), None),
                    (f"scrub {shape.label}: s5cmd cat CPU-s per GiB", tools["s5cmd_cat"]["median_cpu_s_per_gib"], None)]
                   if raw is not None else []),
                 (f"scrub {shape.label}: verify CPU-s per GiB", cpu, f"<= {CPU_TARGET}"),
                 (f"scrub {shape.label}: fetch CPU-s per GiB", tools["fetch"]["median_cpu_s_per_gib"], None)]
    one_file = None
    if one_runs:
        tools = table(one_runs, one_total)
        gib_s = {k: round(one_total / GiB / v["median_wall_s"], 3) for k, v in tools.items()}
        one_file = {"artifact": one.label, "file_mib": round(one_total / MiB), "tools": tools, "gib_per_s": gib_s}
        for k, v in gib_s.items():
            rows.append((f"verify of {one.label}: GiB/s, {k.replace('_', ' ')}", v, None))
            rows.append((f"verify of {one.label}: CPU-s per GiB, {k.replace('_', ' ')}",
                         tools[k]["median_cpu_s_per_gib"], None))
    rows += [(f"in-process GiB/s, {k.replace('_', ' ')}", v, None) for k, v in rates.items()]
    model = cores_model(rates)
    for line, row in model.items():
        rows.append((f"cores to verify at {line.replace('_', ' ')} (old, SHA-256)", row["old_sha256_cores"], None))
        if "new_blake3_cores" in row:
            rows.append((f"cores to verify at {line.replace('_', ' ')} (new, BLAKE3)", row["new_blake3_cores"], None))
    print(json.dumps({"runs": args.runs, "pinned": args.pin, "artifacts": reports, "one_file": one_file,
                      "hash_rates_gib_s": rates, "cores_model": model}, indent=2, sort_keys=True), flush=True)
    print_ratios(rows, f"scrub ({'pinned' if args.pin else 'unpinned'}), medians of {args.runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
