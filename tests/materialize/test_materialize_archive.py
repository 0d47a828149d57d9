"""An archived source: the skip decision reads the remote manifest only; payloads are fetched only to build."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from materialize_helpers import DEFAULTS, cli_args, copy_tree, siblings

from ckptflow.archive.publish import publish_artifact
from ckptflow.errors import NotFound, Refused
from ckptflow.fsutil import walk_files
from ckptflow.jsonio import validate
from ckptflow.materialize import materialize
from ckptflow.records import materialized as marker
from ckptflow.store import LocalStore, load_credentials
from ckptflow.store.s3 import S3Store
from helpers.artifacts import make_trained_artifact
from helpers.cli import run_cli
from helpers.trees import tree_state

UPLOAD_PREFIX = "proj/group/run1/20261129T000000Z/checkpoints"
ARTIFACT_PREFIX = "proj/group/run1/20261129T000000Z/checkpoint_artifacts/iter_000300"


class GetCounter:
    """Counts S3 GetObject calls per key on a real store's botocore client."""

    def __init__(self, store: S3Store):
        self.keys: list[str] = []
        store._client.meta.events.register("before-parameter-build.s3.GetObject", self._seen)

    def _seen(self, params, **kwargs):
        self.keys.append(params["Key"])

    def count(self, suffix: str) -> int:
        return sum(1 for k in self.keys if k.endswith(suffix))


def published_copy(models, tmp_path, store, seed: int = 1) -> None:
    """Publish a copy of the tiny artifact, then delete the local copy: only the archive has it."""
    art = copy_tree(models.artifact("qwen3", seed), tmp_path / f"local{seed}" / "checkpoint_artifacts" / "iter_000300")
    publish_artifact(art, store, UPLOAD_PREFIX, progress=False)
    shutil.rmtree(tmp_path / f"local{seed}")


@pytest.fixture
def sw(seaweedfs_bucket, seaweedfs_credentials_path) -> S3Store:
    return S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path))


@pytest.mark.seaweedfs
def test_archive_source_builds_then_skips_without_a_payload_get(models, tmp_path, sw, seaweedfs_bucket):
    published_copy(models, tmp_path, sw)
    uri = f"s3://{seaweedfs_bucket}/{ARTIFACT_PREFIX}"
    out = tmp_path / "teacher"
    gets = GetCounter(sw)

    built = materialize(artifact_uri=uri, base=models.base(), out=out, store=sw, **DEFAULTS)
    report = built.to_report()
    validate(report, "report_materialize", what="materialize report")
    assert report["status"] == "built" and report["fetch"]["downloaded"] == ["model.pt"]
    # A stage the run removes afterwards is private to it: <out>.stage.<host>.<pid>.<token>/iter_N.
    staged = Path(report["staging"].pop("path"))
    assert report["staging"] == {"created": True, "kept": False}
    assert staged.name == "iter_000300" and re.fullmatch(r"teacher\.stage\.[^./]+\.[0-9]+\.[0-9a-f]{8}", staged.parent.name)
    assert staged.parent.parent == tmp_path and not staged.parent.exists()
    assert gets.count("/model.pt") >= 1
    assert siblings(out) == []  # the stage this run created is gone
    record = marker.read_materialized(out)
    assert record.source.uri == uri

    gets.keys.clear()
    skipped = materialize(artifact_uri=uri, base=models.base(), out=out, store=sw, **DEFAULTS)
    assert skipped.status == "skipped"
    assert gets.count("/model.pt") == 0  # the skip made no payload GET …
    assert gets.keys == [f"{ARTIFACT_PREFIX}/.posttrain-checkpoint-artifact.json"]  # … only the manifest's
    assert siblings(out) == []  # and staged nothing


@pytest.mark.seaweedfs
@pytest.mark.slow
def test_cli_materializes_from_seaweedfs_with_credentials(models, tmp_path, sw, seaweedfs_bucket,
                                                          seaweedfs_credentials_path):
    published_copy(models, tmp_path, sw)
    out = tmp_path / "teacher"
    uri = f"s3://{seaweedfs_bucket}/{ARTIFACT_PREFIX}"
    proc = run_cli(*cli_args(uri, models.base(), out, "--credentials", str(seaweedfs_credentials_path), "--keep-staged"))
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_materialize", what="materialize report")
    assert proc.report["status"] == "built" and proc.report["source"]["uri"] == uri
    assert proc.report["staging"]["kept"] is True and siblings(out) == ["teacher.stage"]
    # A request with other identity options is refused on the marker alone, nothing fetched or touched.
    before = tree_state(out)
    proc = run_cli(*cli_args(uri, models.base(), out, "--credentials", str(seaweedfs_credentials_path),
                            "--max-shard-size", "1MB"))
    assert proc.returncode == 1 and proc.report["status"] == "refused"
    assert "option max_shard_bytes" in proc.report["error"]["message"]
    assert tree_state(out) == before


def file_archive(models, tmp_path, seed: int = 1) -> str:
    (tmp_path / "archive").mkdir(exist_ok=True)
    store = LocalStore(tmp_path / "archive")
    published_copy(models, tmp_path, store, seed)
    return f"file://{tmp_path / 'archive' / ARTIFACT_PREFIX}"


def test_local_and_archived_copies_of_one_model_are_the_same_identity(models, tmp_path):
    uri = file_archive(models, tmp_path)
    out = tmp_path / "teacher"
    assert materialize(ckpt_dir=models.artifact(), base=models.base(), out=out, **DEFAULTS).status == "built"
    result = materialize(artifact_uri=uri, base=models.base(), out=out, **DEFAULTS)
    assert result.status == "skipped"  # the URI is recorded, not part of the identity
    assert not (tmp_path / "teacher.stage").exists()


def test_existing_stage_is_reused_and_kept(models, tmp_path):
    uri = file_archive(models, tmp_path)
    stage = tmp_path / "stage"
    (stage / "keep-me").mkdir(parents=True)
    out = tmp_path / "teacher"
    result = materialize(artifact_uri=uri, base=models.base(), out=out, stage_dir=stage, **DEFAULTS)
    private = Path(result.staging["path"]).parent  # fetched beside the named stage, under a name of its own
    assert result.staging == {"path": str(private / "iter_000300"), "created": True, "kept": False}
    assert private.parent == tmp_path and private.name.startswith("stage.") and not private.exists()
    assert sorted(p.name for p in stage.iterdir()) == ["keep-me"]  # the named stage was not touched

    shutil.rmtree(out)
    from ckptflow.archive.fetch import fetch_artifact

    fetch_artifact(uri, stage)  # someone fetched it before: not this invocation's to remove
    result = materialize(artifact_uri=uri, base=models.base(), out=out, stage_dir=stage, **DEFAULTS)
    assert result.fetch["status"] == "already-staged" and result.fetch["downloaded"] == []
    assert result.staging == {"path": str(stage / "iter_000300"), "created": False, "kept": True}
    assert (stage / "iter_000300" / "model.pt").is_file()


def test_archive_without_a_manifest_is_named(models, tmp_path):
    (tmp_path / "archive" / "iter_000300").mkdir(parents=True)
    with pytest.raises(NotFound, match="no committed artifact"):
        materialize(artifact_uri=f"file://{tmp_path / 'archive' / 'iter_000300'}", base=models.base(),
                    out=tmp_path / "teacher", **DEFAULTS)
    assert not (tmp_path / "teacher.stage").exists()


def test_archived_other_source_is_refused_without_fetching(models, tmp_path):
    out = tmp_path / "teacher"
    materialize(ckpt_dir=models.artifact(), base=models.base(), out=out, **DEFAULTS)
    uri = file_archive(models, tmp_path, seed=2)
    before = tree_state(out)
    with pytest.raises(Refused, match=r"source model\.pt"):
        materialize(artifact_uri=uri, base=models.base(), out=out, **DEFAULTS)
    assert tree_state(out) == before
    assert siblings(out) == []



@pytest.mark.seaweedfs
def test_a_build_from_the_archive_fetches_only_the_model_and_a_full_fetch_completes_the_stage(
        models, tmp_path, sw, seaweedfs_bucket):
    """The conversion reads model.pt alone: a build downloads that object and nothing of the optimizer or
    trainer state; the kept stage says so, and a later full fetch into it downloads only the rest."""
    art = make_trained_artifact(tmp_path / "local", models.artifact() / "model.pt")
    publish_artifact(art, sw, UPLOAD_PREFIX, progress=False)
    uri = f"s3://{seaweedfs_bucket}/{ARTIFACT_PREFIX}"
    out, stage = tmp_path / "teacher", tmp_path / "stage"
    gets = GetCounter(sw)

    built = materialize(artifact_uri=uri, base=models.base(), out=out, store=sw, stage_dir=stage, keep_staged=True,
                        **DEFAULTS)
    assert built.status == "built"
    model_size = (art / "model.pt").stat().st_size
    assert built.fetch["downloaded"] == ["model.pt"] and built.fetch["downloaded_bytes"] == model_size
    payload_gets = sorted({k.removeprefix(ARTIFACT_PREFIX + "/") for k in gets.keys} - {
        ".posttrain-checkpoint-artifact.json", ".posttrain-archive.json", ".posttrain-part-digests.json"})
    assert payload_gets == ["model.pt"]  # no GET of optim/ or trainer.pt
    # The teacher is the one the local artifact's model.pt builds.
    local = materialize(ckpt_dir=art, base=models.base(), out=tmp_path / "local-teacher", **DEFAULTS)
    assert marker.read_materialized(out).shards == local.record.shards
    staged = stage / "iter_000300"
    record = json.loads((staged / ".staged.json").read_text())
    assert record["components"] == ["model"] and record["complete"] is True
    assert sorted(walk_files(staged)) == [".posttrain-checkpoint-artifact.json", ".staged.json", "model.pt"]

    from ckptflow.archive.fetch import fetch_artifact

    rest = ["optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp", "trainer.pt"]
    full = fetch_artifact(uri, stage, store=sw, progress=False)
    assert full.status == "resumed" and full.downloaded == rest and full.reused == ["model.pt"]
    assert full.downloaded_bytes == sum((art / p).stat().st_size for p in rest)
    assert "components" not in json.loads((staged / ".staged.json").read_text())
    for rel in ["model.pt", *rest]:
        assert (staged / rel).read_bytes() == (art / rel).read_bytes(), rel
