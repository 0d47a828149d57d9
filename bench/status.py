"""How long ``ckptflow status`` takes to read many artifacts (target: 1,000 in about a second).

Builds ``--artifacts`` committed artifacts (a 4-byte ``model.pt``, a DCP directory of ``--shards`` tiny
files and a manifest each; every third with a receipt bound to it, every fifth of those pruned, staged
and materialized) under a temporary runs root,
then times ``collect_status`` and the rendering of the table, each the median of ``--repeat`` runs, and
prints the timings as JSON (wall and CPU: on a shared machine the CPU time is the comparable one). Nothing is hashed by status, so the cost is one directory listing, a stat per
payload file and the small record reads.

    python bench/status.py --artifacts 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from ckptflow.digest import sha256_bytes
from ckptflow.records import manifest as manifest_record
from ckptflow.records import materialized as materialized_record
from ckptflow.records import receipt as receipt_record
from ckptflow.records import staging as staging_record
from ckptflow.records.inventory import FileEntry
from ckptflow.status import collect_status

SHA = "a" * 64


def build(root: Path, count: int, shards: int) -> None:
    for i in range(count):
        art = root / f"proj/group/run{i % 4}/20261129T000000Z/checkpoint_artifacts/iter_{i:06d}"
        (art / "optim").mkdir(parents=True)
        files = [FileEntry(f"__{r}_0.distcp", 4, SHA) for r in range(shards)]
        manifest = manifest_record.Manifest(iteration=i, components={
            "model": manifest_record.FileComponent("model.pt", 4, SHA),
            "optim": manifest_record.DcpComponent("optim", tuple(files))})
        data = manifest_record.encode_manifest(manifest)
        (art / manifest_record.FILENAME).write_bytes(data)
        receipt = i % 3 == 0
        if not (receipt and i % 5 == 0):
            (art / "model.pt").write_bytes(b"abcd")
            for f in files:
                (art / "optim" / f.path).write_bytes(b"abcd")
        if receipt:  # bound to its artifact (manifest digest, iter_N), so status checks the binding too
            record = receipt_record.Receipt(
                receipt_record.ReceiptDestination("s3", "s3.example:443", "b", f"p/iter_{i:06d}"), SHA,
                (FileEntry("model.pt", 4, SHA), *(FileEntry(f"optim/{f.path}", 4, SHA) for f in files),
                 FileEntry(manifest_record.FILENAME, len(data), sha256_bytes(data))),
                "2026-01-01T00:00:00Z")
            (art / receipt_record.FILENAME).write_bytes(receipt_record.encode_receipt(record))
        if receipt and i % 5 == 0:  # pruned: staged and materialized from the archive
            run = art.parent.parent.relative_to(root).as_posix()
            stage, teacher = root.parent / "stage" / run / art.name, root.parent / "teachers" / run / art.name
            stage.mkdir(parents=True)
            teacher.mkdir(parents=True)
            (stage / "model.pt").write_bytes(b"abcd")
            staging_record.write_staging(stage, staging_record.StagingRecord(
                "s3://b/p/" + art.name, SHA, (FileEntry("model.pt", 4, SHA),), complete=True))
            (teacher / "model.safetensors").write_bytes(b"abcd")
            materialized_record.write_materialized(teacher, materialized_record.Materialized(
                "1", materialized_record.SourceIdentity("s3://b/p/" + art.name, SHA, 4),
                materialized_record.BaseModelIdentity("/models/base", SHA, None), {},
                (FileEntry("model.safetensors", 4, SHA),), 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifacts", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=4, help="DCP files per artifact")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckptflow-bench-status-") as tmp:
        root = Path(tmp) / "runs"
        start = time.perf_counter()
        build(root, args.artifacts, args.shards)
        built = time.perf_counter() - start
        collect, cpu, render = [], [], []
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            status = collect_status(root, stage_dir=root.parent / "stage", teachers_dir=root.parent / "teachers")
            collect.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            start = time.perf_counter()
            status.render()
            render.append(time.perf_counter() - start)
        counts = status.to_report()["counts"]
    print(json.dumps({
        "artifacts": args.artifacts, "files_per_artifact": args.shards + 1, "build_s": round(built, 3),
        "collect_median_s": round(statistics.median(collect), 3),
        "collect_cpu_median_s": round(statistics.median(cpu), 3), "render_median_s": round(statistics.median(render), 3),
        "counts": counts,
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
