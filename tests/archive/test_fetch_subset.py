"""fetch --only: a copy of named components, recorded as such, completed later by a full fetch."""

from __future__ import annotations

import json

import pytest
from archive_helpers import CountingStore

from ckptflow.archive.fetch import fetch_artifact
from ckptflow.archive.publish import publish_artifact
from ckptflow.errors import Refused
from ckptflow.fsutil import walk_files
from ckptflow.jsonio import validate
from ckptflow.records import manifest as manifest_record
from ckptflow.records import staging as staging_record
from ckptflow.store.local import LocalStore
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX
from helpers.cli import run_cli, run_on_terminal
from helpers.trees import tree_state

OPTIM = ["optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp", "optim/__2_0.distcp"]
RUN = "proj/group/run1/20261129T000000Z"  # the run of ARTIFACT_PREFIX, as status names it


def size(artifact, paths) -> int:
    return sum((artifact / p).stat().st_size for p in paths)


def raw_record(staged) -> dict:
    return json.loads((staged / staging_record.FILENAME).read_text())


def status_cell(tmp_path, stage_root) -> tuple[dict, str]:
    """The staged cell of ``ckptflow status`` (JSON) and the STAGED column of its table, real CLI."""
    args = ("status", str(tmp_path / "no-runs"), "--stage-dir", str(stage_root))
    (tmp_path / "no-runs").mkdir(exist_ok=True)
    proc = run_cli(*args, "--json")
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_status", what="status report")
    [row] = proc.report["rows"]
    table = run_on_terminal(*args, "--wide")  # the table a terminal gets, one line per row
    [line] = [x for x in table.stdout.splitlines() if x.startswith(RUN)]
    return row["staged"], line


@pytest.mark.seaweedfs
@pytest.mark.slow
def test_only_model_then_a_full_fetch_downloads_only_the_rest_and_status_says_so(
        artifact, sw_store, seaweedfs_credentials_path, tmp_path):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    stage_root = tmp_path / "stage" / RUN
    args = ("fetch", "--artifact-uri", f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", "--dst", str(stage_root),
            "--credentials", str(seaweedfs_credentials_path))
    staged = stage_root / "iter_000300"

    only = run_cli(*args, "--only", "model")
    assert only.returncode == 0, only.stderr
    validate(only.report, "report_fetch", what="fetch report")
    assert only.report["status"] == "fetched" and only.report["components"] == ["model"]
    assert only.report["downloaded"] == ["model.pt"]
    assert only.report["downloaded_bytes"] == size(artifact, ["model.pt"])
    assert only.report["not_fetched"] == OPTIM
    assert sorted(walk_files(staged)) == sorted(["model.pt", manifest_record.FILENAME, staging_record.FILENAME])
    record = raw_record(staged)  # the record says it is a copy of the model alone, complete as such
    assert record["components"] == ["model"] and record["complete"] is True
    assert [f["path"] for f in record["files"]] == [manifest_record.FILENAME, "model.pt"]
    cell, line = status_cell(tmp_path, tmp_path / "stage")
    assert cell["state"] == "staged" and cell["components"] == ["model"] and "detail" not in cell
    assert "staged (model only)" in line

    again = run_cli(*args, "--only", "model")  # subset, then the same subset: nothing downloaded
    assert again.returncode == 0 and again.report["status"] == "already-staged"
    assert again.report["downloaded"] == [] and again.report["downloaded_bytes"] == 0

    full = run_cli(*args)  # the whole artifact: only what the subset did not hold is downloaded
    assert full.returncode == 0, full.stderr
    assert full.report["status"] == "resumed" and full.report["components"] is None
    assert full.report["downloaded"] == OPTIM and full.report["reused"] == ["model.pt"]
    assert full.report["downloaded_bytes"] == size(artifact, OPTIM)
    for rel in ["model.pt", *OPTIM, manifest_record.FILENAME]:
        assert (staged / rel).read_bytes() == (artifact / rel).read_bytes(), rel
    record = raw_record(staged)
    assert "components" not in record and record["complete"] is True  # a whole copy, as every earlier record
    assert len(record["files"]) == 6
    cell, line = status_cell(tmp_path, tmp_path / "stage")
    assert cell["state"] == "staged" and "components" not in cell and "only)" not in line

    before = tree_state(staged)  # a subset of a complete whole copy: already staged, nothing written
    last = run_cli(*args, "--only", "model")
    assert last.returncode == 0 and last.report["status"] == "already-staged"
    assert last.report["downloaded_bytes"] == 0 and last.report["components"] == ["model"]
    assert tree_state(staged) == before


def file_uri(artifact, tmp_path) -> str:
    (tmp_path / "archive").mkdir()
    publish_artifact(artifact, LocalStore(tmp_path / "archive"), UPLOAD_PREFIX, progress=False)
    return f"file://{tmp_path}/archive/{ARTIFACT_PREFIX}"


def test_a_subset_request_downloads_nothing_into_a_complete_copy_that_holds_it(artifact, tmp_path):
    uri = file_uri(artifact, tmp_path)
    store = LocalStore(tmp_path / "archive")
    counting = CountingStore(store)
    first = fetch_artifact(uri, tmp_path / "stage", store=counting, components={"model"}, progress=False)
    assert first.status == "fetched" and counting.downloaded_keys() == [f"{ARTIFACT_PREFIX}/model.pt"]

    counting = CountingStore(store)
    again = fetch_artifact(uri, tmp_path / "stage", store=counting, components=["model"], progress=False)
    assert again.status == "already-staged" and counting.downloads == []


def test_an_old_format_record_reads_as_a_whole_copy(artifact, tmp_path):
    """A record without ``components`` (what every earlier version wrote) is a copy of the whole artifact:
    a subset request is already staged, and the stage shows as staged."""
    uri = file_uri(artifact, tmp_path)
    store = LocalStore(tmp_path / "archive")
    staged = fetch_artifact(uri, tmp_path / "stage" / RUN, store=store, progress=False).path
    plan = fetch_artifact(uri, tmp_path / "stage" / RUN, store=store, progress=False).plan
    old = {"protocol": "ckptflow.staged.v1", "source_uri": uri, "declaration_sha256": plan.declaration_sha256,
           "files": [e.to_dict() for e in plan.inventory], "complete": True}
    (staged / staging_record.FILENAME).write_text(json.dumps(old, sort_keys=True, indent=2) + "\n")
    before = tree_state(staged)

    counting = CountingStore(store)
    result = fetch_artifact(uri, tmp_path / "stage" / RUN, store=counting, components={"model"}, progress=False)
    assert result.status == "already-staged" and counting.downloads == []
    assert tree_state(staged) == before
    cell, line = status_cell(tmp_path, tmp_path / "stage")
    assert cell["state"] == "staged" and "components" not in cell and "only)" not in line


def test_a_component_the_manifest_does_not_have_is_refused_by_name(artifact, tmp_path):
    uri = file_uri(artifact, tmp_path)
    with pytest.raises(Refused, match=r"no component 'optimizer' \(its components: model, optim\)"):
        fetch_artifact(uri, tmp_path / "stage", components={"model", "optimizer"}, progress=False)
    assert not (tmp_path / "stage").exists()
