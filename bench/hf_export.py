"""The cost of the Hugging Face callback's export (``trainer.hf.export_checkpoint``) for one checkpoint:
wall time and bytes the file system gives to the artifact, against a hard-linked export (links and the same
seal: what the export cost before artifacts owned their bytes) and ``cp -r`` of the same directory; then
what the training loop waits for: the time inside ``ArtifactCallback.on_save`` with ``asynchronous=False``
(the whole export) and ``asynchronous=True`` (the snapshot of the files; the export on a background thread),
and the next save's wait for that export (``on_step_end`` with ``should_save``) when the next save comes at
once, before the export could end (the worst case: a loop that trains for longer between saves waits less).

    python bench/hf_export.py --dir /scratch/bench --gib 1

The checkpoint is ``config.json``, an optimizer state of a fifth and the rest as ``model.safetensors``, random
bytes written once and read from the page cache by every contender (each runs on a fresh ``iter_N``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from ckptflow.artifact import ComponentSpec, seal_artifact
from ckptflow.fsutil import clone_file
from ckptflow.trainer.hf import ArtifactCallback, export_checkpoint

MiB = 1 << 20


def used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def make_checkpoint(root: Path, nbytes: int) -> Path:
    ckpt = root / "checkpoint-100"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text('{"model_type": "qwen3"}\n')
    for name, size in (("optimizer.pt", nbytes // 5), ("model.safetensors", nbytes - nbytes // 5)):
        with open(ckpt / name, "wb") as fh:
            for _ in range(size // (64 * MiB)):
                fh.write(os.urandom(64 * MiB))
            fh.write(os.urandom(size % (64 * MiB)))
    return ckpt


def timed(fn, root: Path) -> tuple[float, int]:
    """Seconds ``fn`` takes (its own fsyncs included) and the bytes the file system then holds more (exact
    only on a file system nobody else writes to: a loop-mounted image, a tmpfs)."""
    os.sync()
    before, start = used(root), time.perf_counter()
    fn()
    seconds = time.perf_counter() - start
    os.sync()
    return seconds, used(root) - before


def linked_export(ckpt: Path, run_dir: Path, iteration: int) -> None:
    art = run_dir / "checkpoint_artifacts" / f"iter_{iteration:06d}"
    art.mkdir(parents=True)
    for name in sorted(os.listdir(ckpt)):
        os.link(ckpt / name, art / name)
    seal_artifact(art, iteration, [ComponentSpec(n.replace(".", "_"), n) for n in sorted(os.listdir(ckpt))],
                  progress=False)


def callback_rows(ckpt: Path, root: Path, rounds: int) -> list[tuple[str, list[float]]]:
    """The loop's wait at ``on_save`` (both modes, alternating, ``rounds`` each) and, asynchronous, at the next
    save, for ``ckpt``; each export into a fresh run directory, after ``os.sync``."""
    step = int(ckpt.name.split("-")[1])
    args = SimpleNamespace(output_dir=str(ckpt.parent), save_total_limit=None, save_strategy="steps")
    state = SimpleNamespace(global_step=step, max_steps=10 * step, best_model_checkpoint=None)
    seconds: dict[str, list[float]] = {}
    for r in range(rounds):
        for mode in ("sync", "async"):
            callback = ArtifactCallback(root / f"callback-{mode}-{r}", asynchronous=mode == "async")
            os.sync()
            start = time.perf_counter()
            callback.on_save(args, state, SimpleNamespace(should_save=False, should_training_stop=False))
            in_on_save = time.perf_counter() - start
            start = time.perf_counter()
            callback.on_step_end(args, state, SimpleNamespace(should_save=True, should_training_stop=False))
            waited = time.perf_counter() - start
            assert callback.exported == [step]
            seconds.setdefault(f"on_save, asynchronous={mode == 'async'}", []).append(in_on_save)
            if mode == "async":
                seconds.setdefault("  + the next save's wait", []).append(waited)
            shutil.rmtree(root / f"callback-{mode}-{r}")
    return list(seconds.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the callback's timings (medians)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hf-export-", dir=args.dir))
    try:
        ckpt = make_checkpoint(root / "run", int(args.gib * (1 << 30)))
        size = sum(p.stat().st_size for p in ckpt.iterdir())
        fs = subprocess.run(["stat", "-f", "-c", "%T", str(root)], capture_output=True, text=True).stdout.strip()
        rows = [("hard links + seal (before)", timed(lambda: linked_export(ckpt, root / "run", 1), root)),
                ("export_checkpoint (now)", timed(lambda: export_checkpoint(ckpt, root / "run", 2), root)),
                ("cp -r (peer)", timed(lambda: shutil.copytree(ckpt, root / "cp-copy"), root))]
        with tempfile.TemporaryDirectory(dir=root) as probe:
            how = clone_file(ckpt / "config.json", Path(probe) / "config.json")
        print(f"checkpoint {size / (1 << 30):.2f} GiB on {fs} (the export makes a {how} of each file)")
        base = rows[0][1][0]
        for name, (seconds, grew) in rows:
            print(f"  {name:28s} {seconds:7.2f} s  x{seconds / base:4.2f}  disk +{grew / (1 << 20):7.1f} MiB")
        print(f"the training loop's wait (ArtifactCallback; the next save right after this one; median of "
              f"{args.rounds}):")
        for name, runs in callback_rows(ckpt, root, args.rounds):
            print(f"  {name:28s} {statistics.median(runs):7.3f} s  ({', '.join(f'{x:.3f}' for x in runs)})")
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
