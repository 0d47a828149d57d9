"""Helpers for the archive tests: real artifacts sealed with the real `seal`, the real CLI in a subprocess."""

from __future__ import annotations

from pathlib import Path

from helpers.artifacts import ARTIFACT_PREFIX


def remote_snapshot(store, prefix: str = ARTIFACT_PREFIX) -> dict[str, tuple[int, str | None]]:
    return {o.key: (o.size, store.head(o.key).sha256) for o in store.list(prefix + "/")}








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
