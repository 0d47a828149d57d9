"""Helpers for the archive tests: real artifacts sealed with the real `seal`, the real CLI in a subprocess."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from ckptflow.artifact import ComponentSpec, seal_artifact

REPO = Path(__file__).resolve().parents[2]
UPLOAD_PREFIX = "proj/group/run1/20261129T000000Z/checkpoints"
ARTIFACT_PREFIX = "proj/group/run1/20261129T000000Z/checkpoint_artifacts/iter_000300"


def make_artifact(root: Path, *, iteration: int = 300, model_bytes: int = 300_000, shards: int = 3, seed: int = 0) -> Path:
    """``<root>/checkpoint_artifacts/iter_N`` with model.pt, a DCP optim/ and a stale unselected optim.pt."""
    art = root / "checkpoint_artifacts" / f"iter_{iteration:06d}"
    (art / "optim").mkdir(parents=True)
    rnd = random.Random(seed)
    with open(art / "model.pt", "wb") as fh:  # in pieces: randbytes takes at most 2**31 bits at once
        for left in range(model_bytes, 0, -(64 << 20)):
            fh.write(rnd.randbytes(min(left, 64 << 20)))
    (art / "optim" / ".metadata").write_bytes(rnd.randbytes(777))
    for i in range(shards):
        (art / "optim" / f"__{i}_0.distcp").write_bytes(rnd.randbytes(50_000 + i))
    (art / "optim.pt").write_bytes(b"stale, not selected by the manifest")
    seal_artifact(art, iteration, [ComponentSpec("model", "model.pt"), ComponentSpec("optim", "optim")], progress=False)
    return art


def remote_snapshot(store, prefix: str = ARTIFACT_PREFIX) -> dict[str, tuple[int, str | None]]:
    return {o.key: (o.size, store.head(o.key).sha256) for o in store.list(prefix + "/")}


def run_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the real `python -m ckptflow` in a subprocess; stdout must be exactly one JSON report."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-m", "ckptflow", *args], capture_output=True, text=True, env=full_env, timeout=timeout, cwd=REPO
    )
    proc.report = json.loads(proc.stdout) if proc.stdout.strip() else None  # type: ignore[attr-defined]
    if proc.report is not None:
        assert proc.stdout.count("\n") == 1, proc.stdout
    return proc


def start_cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "ckptflow", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=full_env, cwd=REPO,
    )


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until a paused process has written its pause file (fail early if it exited instead)."""
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) before pausing: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"process did not reach its pause point within {timeout} s")
        time.sleep(0.05)


def tree_bytes(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root`` (files by content, symlinks by target, directories as "<dir>"), nothing followed."""
    out: dict[str, bytes | str] = {}
    if not root.exists():
        return out
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = f"-> {os.readlink(path)}"
        elif path.is_dir():
            out[rel] = "<dir>"
        else:
            out[rel] = path.read_bytes()
    return out


def add_merge_record(artifact: Path, diag: str = "diag.json") -> None:
    """Give a sealed artifact a merge completion record naming ``diag`` (written beside it)."""
    from ckptflow.records import manifest as manifest_record
    from ckptflow.records import merge_record

    model = manifest_record.read_manifest(artifact).components["model"]
    (artifact / diag).write_text('{"tensors": {}}\n')
    rec = merge_record.MergeRecord.from_dict({
        "protocol": merge_record.PROTOCOL,
        "tool_version": "ckptflow-merge/1",
        "request": {"mode": "avg", "experts": [{"path": "/e/a/model.pt", "size": 1, "sha256": "a" * 64}],
                    "base": None, "lam": None, "iteration": 300},
        "outputs": [{"path": "model.pt", "size": model.size, "sha256": model.sha256}],
        "diag": diag,
    })
    merge_record.write_merge_record(artifact, rec)


class CountingStore:
    """A real store that records what is downloaded; all else passes through.

    ``downloads`` holds ``(key, start, end)`` for every range opened and every whole ``download_file``
    call (the ranges such a call opens inside the store are not counted twice).
    """

    def __init__(self, inner):
        self._inner = inner
        self.downloads: list[tuple[str, int, int]] = []
        self.whole_calls: list[tuple[str, int, int | None]] = []

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def open_range(self, key, offset, length):
        self.downloads.append((key, offset, offset + length))
        return self._inner.open_range(key, offset, length)

    def download_file(self, key, dest, *, size=None, start=0, hasher=None, progress=None):
        got = self._inner.download_file(key, dest, size=size, start=start, hasher=hasher, progress=progress)
        self.whole_calls.append((key, start, size))
        self.downloads.append((key, start, got.size))
        return got

    def downloaded_keys(self) -> list[str]:
        return sorted({key for key, _, _ in self.downloads})

    def spans(self, key_suffix: str) -> list[tuple[int, int]]:
        """The byte spans downloaded of the object whose key ends with ``key_suffix``, merged, in order."""
        out: list[list[int]] = []
        for _, start, end in sorted(d for d in self.downloads if d[0].endswith(key_suffix)):
            if out and start <= out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
            else:
                out.append([start, end])
        return [(a, b) for a, b in out]

    def downloaded_bytes(self) -> int:
        return sum(end - start for _, start, end in self.downloads)
