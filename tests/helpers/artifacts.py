"""Sealed sample artifacts: real files, sealed with the real `seal`."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from ckptflow.artifact import ComponentSpec, seal_artifact

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



def make_trained_artifact(root: Path, model_pt: Path, *, iteration: int = 300, seed: int = 0) -> Path:
    """``<root>/checkpoint_artifacts/iter_N`` as a trainer saves it: a copy of the real ``model_pt``, a DCP
    ``optim/`` and a ``trainer.pt`` (what a conversion never reads), sealed as three components."""
    art = root / "checkpoint_artifacts" / f"iter_{iteration:06d}"
    (art / "optim").mkdir(parents=True)
    shutil.copyfile(model_pt, art / "model.pt")
    rnd = random.Random(seed)
    (art / "optim" / ".metadata").write_bytes(rnd.randbytes(777))
    for i in range(2):
        (art / "optim" / f"__{i}_0.distcp").write_bytes(rnd.randbytes(80_000 + i))
    (art / "trainer.pt").write_bytes(rnd.randbytes(30_000))
    seal_artifact(art, iteration, [ComponentSpec("model", "model.pt"), ComponentSpec("optim", "optim"),
                                   ComponentSpec("trainer", "trainer.pt")], progress=False)
    return art
