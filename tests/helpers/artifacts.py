"""Sealed sample artifacts: real files, sealed with the real `seal`."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from ckptflow.artifact import ComponentSpec, seal_artifact

UPLOAD_PREFIX = "proj/group/run1/20261129T000000Z/checkpoints"
ARTIFACT_PREFIX = "proj/group/run1/20261129T000000Z/checkpoint_artifacts/iter_000300"


def write_payloads(art: Path, *, model_bytes: int = 300_000, shards: int = 3, seed: int = 0) -> Path:
    """``art`` (created) holding what a trainer saves there, not sealed: model.pt and a DCP optim/ (its
    .metadata and ``shards`` shards), the same bytes for the same arguments."""
    (art / "optim").mkdir(parents=True)
    rnd = random.Random(seed)
    with open(art / "model.pt", "wb") as fh:  # in pieces: randbytes takes at most 2**31 bits at once
        for left in range(model_bytes, 0, -(64 << 20)):
            fh.write(rnd.randbytes(min(left, 64 << 20)))
    (art / "optim" / ".metadata").write_bytes(rnd.randbytes(777))
    for i in range(shards):
        (art / "optim" / f"__{i}_0.distcp").write_bytes(rnd.randbytes(50_000 + i))
    return art


def make_artifact(root: Path, *, iteration: int = 300, model_bytes: int = 300_000, shards: int = 3, seed: int = 0) -> Path:
    """``<root>/checkpoint_artifacts/iter_N`` with model.pt, a DCP optim/ and a stale unselected optim.pt."""
    art = write_payloads(root / "checkpoint_artifacts" / f"iter_{iteration:06d}", model_bytes=model_bytes,
                         shards=shards, seed=seed)
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


def publish_without_part_digests(artifact: Path, store, upload_prefix: str = UPLOAD_PREFIX):
    """Publish ``artifact`` as a ckptflow without part digests did: its declaration (the same files, no part
    digests record) is put first, and publish keeps the form the archive already has, so the archive is
    byte for byte what that version wrote, read and verified by whole-file SHA-256 only."""
    from ckptflow.archive.keys import artifact_prefix, object_key, upload_prefix_for
    from ckptflow.archive.publish import publish_artifact
    from ckptflow.archive.publish_inventory import build_local_inventory
    from ckptflow.digest import sha256_bytes
    from ckptflow.records import declaration as declaration_record

    plain = build_local_inventory(artifact, progress=False).without_part_digests()
    prefix = artifact_prefix(upload_prefix_for(artifact, upload_prefix), artifact.name)
    store.put_bytes_create_once(object_key(prefix, declaration_record.FILENAME), plain.declaration_bytes,
                                sha256=sha256_bytes(plain.declaration_bytes))
    result = publish_artifact(artifact, store, upload_prefix, progress=False)
    assert not (artifact / ".posttrain-part-digests.json").exists()
    return result
