"""Listing cost: ``ckptflow ls`` of 1,000 archived artifacts versus a plain listing of the same prefix.

The archive: ``--artifacts`` tiny artifacts (a declaration, a manifest and a 4-byte ``model.pt`` each,
written directly with the store API, concurrently, so the setup takes seconds) under one prefix of a
scratch bucket. ckptflow's run is the real ``ckptflow ls s3://B/prefix`` in a child process: one paginated
listing and one GET of each declaration (concurrent, through the store's ``small_gets``), the report validated
in memory, JSON on stdout.
The peers list the same prefix and read nothing: ``aws s3 ls --recursive`` when the AWS CLI is on PATH,
``s5cmd ls`` and ``rclone lsl`` when installed (``peers.py``), and always a raw boto3 paginated
``list_objects_v2`` in a child of its own. Runs are interleaved (``benchlib.interleaved``), medians
printed as JSON with each ratio ckptflow / peer. Target: within 1.5x of the plain listing (printed, not
asserted).

    python bench/ls.py --credentials .ckptflow/bench-servers/credentials-seaweedfs.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from benchlib import add_raw_child_args, interleaved, raw_client, run_measured, scratch_bucket
from ckptflow.digest import sha256_bytes
from ckptflow.records import declaration as declaration_record
from ckptflow.records import manifest as manifest_record
from ckptflow.records.inventory import FileEntry
from ckptflow.store.credentials import load_credentials
from peers import Measured, Peers, measured

PREFIX = "bench/ls"
PAYLOAD = b"abcd"


def populate(store, count: int, prefix: str = PREFIX) -> None:
    """``count`` committed artifacts over 10 runs: payload, declaration, manifest (the publisher's order)."""
    def one(i: int) -> None:
        art = f"{prefix}/run{i % 10}/20260101T000000Z/checkpoint_artifacts/iter_{i:06d}"
        manifest = manifest_record.encode_manifest(manifest_record.Manifest(
            iteration=i, components={"model": manifest_record.FileComponent("model.pt", 4, sha256_bytes(PAYLOAD))}))
        declaration = declaration_record.encode_declaration(declaration_record.Declaration(
            sha256_bytes(manifest), i, (FileEntry("model.pt", 4, sha256_bytes(PAYLOAD)),
                                        FileEntry(manifest_record.FILENAME, len(manifest), sha256_bytes(manifest)))))
        for name, data in ((declaration_record.FILENAME, declaration), ("model.pt", PAYLOAD),
                           (manifest_record.FILENAME, manifest)):
            store.put_bytes_create_once(f"{art}/{name}", data, sha256=sha256_bytes(data))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))


def _raw_child(args: argparse.Namespace) -> int:
    """The raw peer: a paginated ``list_objects_v2`` of the prefix, one line per object, as ``aws s3 ls`` prints."""
    from ckptflow.store.s3 import S3Store

    creds = load_credentials(args.credentials)
    client = raw_client(creds, S3Store(args.bucket, creds))
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=args.bucket, Prefix=args.paths):
        out += [f"{o['LastModified']} {o['Size']} {o['Key']}" for o in page.get("Contents", [])]
    sys.stdout.write("\n".join(out) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--credentials", required=True)
    ap.add_argument("--artifacts", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=5)
    add_raw_child_args(ap)
    args = ap.parse_args()
    if args.raw_child:
        return _raw_child(args)

    creds = load_credentials(args.credentials)
    objects = 3 * args.artifacts
    runs: dict[str, list[Measured]] = {"ckptflow": [], "raw_boto3": []}
    aws = shutil.which("aws")
    notes = [] if aws else ["aws not on PATH: `aws s3 ls --recursive` skipped"]
    with scratch_bucket(creds, "ls") as store, tempfile.TemporaryDirectory() as tmp:
        populate(store, args.artifacts)
        peers = Peers(creds, Path(tmp))
        notes += peers.notes
        runs.update({f"{name}_ls": [] for name in peers.tools})
        if aws:
            runs["aws_s3_ls"] = []
        uri = f"s3://{store.bucket}/{PREFIX}"

        def ckptflow_side() -> None:
            got = run_measured(["-m", "ckptflow", "ls", uri, "--credentials", args.credentials, "--json"])
            report = json.loads(got.out)
            assert report["counts"]["committed"] == args.artifacts, report["counts"]
            runs["ckptflow"].append(got)

        def raw_side() -> None:
            got = run_measured([__file__, "--raw-child", "--credentials", args.credentials, "--bucket", store.bucket,
                                "--paths", PREFIX + "/"])
            assert got.out.count("\n") == objects, got.out[-200:]
            runs["raw_boto3"].append(got)

        def aws_side() -> None:
            got = measured([aws, "s3", "ls", "--recursive", "--endpoint-url", creds.endpoint_url, f"{uri}/"], peers.env)
            assert got.out.count("\n") == objects, got.out[-200:]
            runs["aws_s3_ls"].append(got)

        def peer_side(name: str) -> None:
            runs[f"{name}_ls"].append(peers.listing(name, store.bucket, PREFIX))

        steps = [ckptflow_side, raw_side, *([aws_side] if aws else []), *(partial(peer_side, n) for n in peers.tools)]
        for run in range(args.runs):
            interleaved(steps, run)
            print(f"run {run + 1}/{args.runs}: " + ", ".join(f"{k} {v[-1].wall:.2f}s" for k, v in runs.items()),
                  file=sys.stderr)
    median = {name: statistics.median(m.wall for m in got) for name, got in runs.items()}
    print(json.dumps({
        "artifacts": args.artifacts, "objects": objects, "runs": args.runs, "notes": notes,
        "median_wall_s": {k: round(v, 3) for k, v in median.items()},
        "median_cpu_s": {k: round(statistics.median(m.cpu for m in got), 3) for k, got in runs.items()},
        "ratio_ckptflow_to": {k: round(median["ckptflow"] / v, 2) for k, v in median.items() if k != "ckptflow"},
        "target": "ckptflow ls within 1.5x of the plain listing",
    }, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
