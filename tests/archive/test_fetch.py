"""fetch: round trip, the declaration as authority, verification while writing, ownership of the stage."""

from __future__ import annotations

import re

import pytest
from archive_helpers import CountingStore, add_merge_record

from ckptflow.archive.fetch import fetch_artifact
from ckptflow.archive.publish import publish_artifact
from ckptflow.errors import ConflictError, NotFound, Refused, UnsafePath, VerificationFailed
from ckptflow.fsutil import walk_files
from ckptflow.records import manifest as manifest_record
from ckptflow.records import staging as staging_record
from ckptflow.store.credentials import load_credentials
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact, publish_without_part_digests
from helpers.trees import tree_bytes

PAYLOADS = ["model.pt", "optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp", "optim/__2_0.distcp"]
MiB = 1024 * 1024
STAGED = sorted([*PAYLOADS, manifest_record.FILENAME, staging_record.FILENAME])


def s3_uri(store) -> str:
    return f"s3://{store.bucket}/{ARTIFACT_PREFIX}"


@pytest.fixture
def published(artifact, sw_store) -> str:
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    return s3_uri(sw_store)


def assert_identical(artifact, staged, paths=PAYLOADS):
    for rel in [*paths, manifest_record.FILENAME]:
        assert (staged / rel).read_bytes() == (artifact / rel).read_bytes(), rel


def no_parts(root):
    return [p for p in walk_files(root) if p.endswith(".part")]


def test_round_trip_is_byte_identical_complete_and_the_second_fetch_downloads_nothing(
        artifact, published, sw_store, seaweedfs_credentials_path, tmp_path):
    result = fetch_artifact(published, tmp_path / "stage", credentials=load_credentials(seaweedfs_credentials_path),
                           progress=False)
    staged = tmp_path / "stage" / "iter_000300"
    assert result.status == "fetched" and result.path == staged
    assert_identical(artifact, staged)
    assert list(walk_files(staged)) == STAGED  # the stale, unselected optim.pt stays out
    record = staging_record.read_staging(staged)
    assert record.complete and record.source_uri == published
    assert record.declaration_sha256 == result.plan.declaration_sha256
    assert [e.path for e in record.files] == sorted([*PAYLOADS, manifest_record.FILENAME])
    report = result.to_report()
    assert report["downloaded_bytes"] == sum((artifact / p).stat().st_size for p in PAYLOADS)
    assert report["downloaded"] == PAYLOADS and report["legacy"] is False

    counting = CountingStore(sw_store)
    again = fetch_artifact(published, tmp_path / "stage", store=counting, progress=False)
    assert again.status == "already-staged" and counting.downloads == []


@pytest.mark.parametrize("part_digests", [False, True])
def test_objects_are_fetched_in_ranges_of_the_store_s_download_shape(sw_store, seaweedfs_credentials_path, tmp_path,
                                                                      part_digests):
    art = make_artifact(tmp_path / "run", model_bytes=5 * MiB // 2)
    if part_digests:
        publish_artifact(art, sw_store, UPLOAD_PREFIX, progress=False)
    else:
        publish_without_part_digests(art, sw_store)
    store = S3Store(sw_store.bucket, load_credentials(seaweedfs_credentials_path), download_concurrency=2,
                    download_range_size=MiB)
    counting = CountingStore(store)
    result = fetch_artifact(s3_uri(sw_store), tmp_path / "stage", store=counting, progress=False)
    assert_identical(art, result.path)
    model = sorted((start, end) for key, start, end in counting.downloads if key.endswith("/model.pt"))
    if part_digests:  # ranges are whole 8 MiB parts, each checked by the thread that received it
        assert model == [(0, 5 * MiB // 2)]
    else:
        assert model == [(0, MiB), (MiB, 2 * MiB), (2 * MiB, 5 * MiB // 2)]


def test_round_trip_from_a_file_archive(artifact, tmp_path):
    (tmp_path / "archive").mkdir()
    publish_artifact(artifact, LocalStore(tmp_path / "archive"), UPLOAD_PREFIX, progress=False)
    uri = f"file://{tmp_path}/archive/{ARTIFACT_PREFIX}"
    result = fetch_artifact(uri, tmp_path / "stage", progress=False)
    assert result.status == "fetched"
    assert_identical(artifact, result.path)
    assert staging_record.read_staging(result.path).complete


def test_merge_record_and_diagnostic_are_archived_but_not_fetched(artifact, sw_store, tmp_path):
    add_merge_record(artifact)
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    result = fetch_artifact(s3_uri(sw_store), tmp_path / "stage", store=sw_store, progress=False)
    assert result.plan.not_fetched == (".merge-complete.json", "diag.json")
    assert list(walk_files(result.path)) == STAGED


def test_when_the_first_file_fails_its_check_every_other_file_is_whole_and_verified_or_absent(
        artifact, published, sw_store, tmp_path):
    # model.pt is the largest, so it is hashed and checked first while the shards are still in the stream:
    # a shard the stream already holds whole is committed only if it matches, any other part is removed.
    data = bytearray((artifact / "model.pt").read_bytes())
    data[4321] ^= 0x01
    key = f"{ARTIFACT_PREFIX}/model.pt"
    sha = sw_store.head(key).sha256
    sw_store._client.put_object(Bucket=sw_store.bucket, Key=key, Body=bytes(data), Metadata={"sha256": sha})
    with pytest.raises(VerificationFailed, match=r"model\.pt"):
        fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    staged = tmp_path / "stage" / "iter_000300"
    assert no_parts(staged) == []
    assert not (staged / "model.pt").exists()
    for rel in PAYLOADS[1:]:
        assert not (staged / rel).exists() or (staged / rel).read_bytes() == (artifact / rel).read_bytes(), rel
    assert not (staged / manifest_record.FILENAME).exists()
    assert staging_record.read_staging(staged).complete is False


def test_a_shard_missing_remotely_fails_by_name_and_nothing_is_marked_complete(published, sw_store, tmp_path):
    sw_store.delete(f"{ARTIFACT_PREFIX}/optim/__1_0.distcp")
    with pytest.raises(NotFound, match=r"optim/__1_0\.distcp.*missing") as err:
        fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    assert "republish" in str(err.value)
    staged = tmp_path / "stage" / "iter_000300"
    assert not staging_record.path_in(staged).exists() or not staging_record.read_staging(staged).complete


def test_one_changed_byte_fails_naming_the_file_and_removes_its_part(artifact, published, sw_store, tmp_path):
    key = f"{ARTIFACT_PREFIX}/optim/__1_0.distcp"
    data = bytearray((artifact / "optim/__1_0.distcp").read_bytes())
    data[1234] ^= 0x01
    sha = sw_store.head(key).sha256  # keep the metadata: only the content betrays the change
    sw_store._client.put_object(Bucket=sw_store.bucket, Key=key, Body=bytes(data), Metadata={"sha256": sha})
    with pytest.raises(VerificationFailed, match=r"optim/__1_0\.distcp") as err:
        fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    # its one part fails its part digest, also when read again: the byte range is named
    assert re.search(r"bytes 0-\d+ \(part 1 of 1\).*\(read twice\)", str(err.value)), str(err.value)
    staged = tmp_path / "stage" / "iter_000300"
    assert no_parts(staged) == []
    assert not (staged / "optim/__1_0.distcp").exists()
    assert staging_record.read_staging(staged).complete is False
    assert not (staged / manifest_record.FILENAME).exists()  # the manifest only follows every payload


def put_declaration(store, files, manifest_sha="0" * 64):
    import json

    body = {"protocol": "posttrain.artifact-archive.v1", "iteration": 300, "manifest_sha256": manifest_sha,
            "files": [*files, {"path": manifest_record.FILENAME, "size": 10, "sha256": manifest_sha}]}
    store._client.put_object(Bucket=store.bucket, Key=f"{ARTIFACT_PREFIX}/.posttrain-archive.json",
                             Body=json.dumps(body).encode())


@pytest.mark.parametrize("files, problem", [
    ([{"path": "../escape", "size": 1, "sha256": "a" * 64}], r"'\.\./escape'"),
    ([{"path": "/etc/x", "size": 1, "sha256": "a" * 64}], r"'/etc/x' is absolute"),
    ([{"path": "model.pt", "size": 1, "sha256": "a" * 64}, {"path": "model.pt", "size": 1, "sha256": "a" * 64}],
     r"'model\.pt' twice"),
    ([{"path": "optim", "size": 1, "sha256": "a" * 64}, {"path": "optim/x", "size": 1, "sha256": "a" * 64}],
     r"'optim' as a file and as the directory"),
    ([{"path": "model.pt", "size": -1, "sha256": "a" * 64}], r"files/0/size"),
    ([{"path": "model.pt", "size": 1, "sha256": "A" * 64}], r"files/0/sha256"),
])
def test_a_hostile_declaration_is_refused_before_anything_is_written(published, sw_store, tmp_path, files, problem):
    put_declaration(sw_store, files)
    parent = tmp_path / "parent"
    (parent / "stage").mkdir(parents=True)
    before = tree_bytes(tmp_path)
    with pytest.raises(ValueError, match=problem) as err:
        fetch_artifact(published, parent / "stage", store=sw_store, progress=False)
    assert ".posttrain-archive.json" in str(err.value)
    assert tree_bytes(tmp_path) == before  # no stage, no escape, nothing anywhere


def test_a_manifest_naming_fetchs_own_record_is_refused(sw_store, tmp_path):
    import hashlib
    import json

    body = json.dumps({"schema": "posttrain.checkpoint-artifact.v1", "iteration": 300, "components": {
        "model": {"format": "file", "path": ".staged.json", "size": 2, "sha256": "b" * 64}}}).encode()
    sha = hashlib.sha256(body).hexdigest()
    sw_store._client.put_object(Bucket=sw_store.bucket, Key=f"{ARTIFACT_PREFIX}/{manifest_record.FILENAME}", Body=body)
    put_declaration(sw_store, [{"path": ".staged.json", "size": 2, "sha256": "b" * 64}], manifest_sha=sha)
    with pytest.raises(UnsafePath, match=r"'\.staged\.json'.*collides"):
        fetch_artifact(s3_uri(sw_store), tmp_path / "stage", store=sw_store, progress=False)
    assert not (tmp_path / "stage").exists()


def test_a_foreign_directory_is_refused_and_left_byte_identical(published, sw_store, tmp_path):
    staged = tmp_path / "stage" / "iter_000300"
    (staged / "optim").mkdir(parents=True)
    (staged / "model.pt").write_bytes(b"someone else's weights")
    (staged / "optim" / "notes.txt").write_text("mine")
    before = tree_bytes(tmp_path / "stage")
    with pytest.raises(Refused, match=r"iter_000300 holds files but no \.staged\.json") as err:
        fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    assert "choose another --dst" in str(err.value)
    assert tree_bytes(tmp_path / "stage") == before


def test_an_empty_directory_is_not_foreign(published, sw_store, tmp_path):
    (tmp_path / "stage" / "iter_000300").mkdir(parents=True)
    assert fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False).status == "fetched"


def test_own_copy_of_another_source_is_replaced_removing_only_its_own_files(artifact, published, sw_store, tmp_path):
    first = fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    (first.path / "notes.txt").write_text("the user's notes")
    (first.path / "optim" / "mine.bin").write_bytes(b"user bytes")
    other = make_artifact(tmp_path / "run2", seed=7, shards=2)
    publish_artifact(other, sw_store, "proj/group/run2/20261129T000000Z/checkpoints", progress=False)
    other_uri = f"s3://{sw_store.bucket}/proj/group/run2/20261129T000000Z/checkpoint_artifacts/iter_000300"

    result = fetch_artifact(other_uri, tmp_path / "stage", store=sw_store, progress=False)
    assert result.status == "replaced"
    assert result.left_beside == ["notes.txt", "optim/mine.bin"]
    assert sorted(result.removed) == sorted([*PAYLOADS, manifest_record.FILENAME])
    assert (first.path / "notes.txt").read_text() == "the user's notes"
    assert (first.path / "optim" / "mine.bin").read_bytes() == b"user bytes"
    assert not (first.path / "optim" / "__2_0.distcp").exists()  # the old source's third shard is gone
    assert_identical(other, first.path, ["model.pt", "optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp"])
    record = staging_record.read_staging(first.path)
    assert record.complete and record.source_uri == other_uri


def test_a_user_file_where_the_new_source_needs_one_refuses_the_replacement(published, sw_store, tmp_path):
    first = fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    other = make_artifact(tmp_path / "run2", seed=7, shards=4)
    publish_artifact(other, sw_store, "proj/group/run2/20261129T000000Z/checkpoints", progress=False)
    (first.path / "optim" / "__3_0.distcp").write_bytes(b"the user's file, at a path the new source has")
    before = tree_bytes(first.path)
    with pytest.raises(ConflictError, match=r"__3_0\.distcp is in the way"):
        fetch_artifact(f"s3://{sw_store.bucket}/proj/group/run2/20261129T000000Z/checkpoint_artifacts/iter_000300",
                       tmp_path / "stage", store=sw_store, progress=False)
    assert tree_bytes(first.path) == before


def test_incomplete_own_copy_resumes_keeping_files_whose_hash_matches(artifact, published, sw_store, tmp_path):
    first = fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    record = staging_record.read_staging(first.path)
    staging_record.write_staging(first.path, staging_record.StagingRecord(
        record.source_uri, record.declaration_sha256, record.files, complete=False))
    (first.path / "optim" / "__0_0.distcp").unlink()
    (first.path / "model.pt").write_bytes(b"damaged")  # own file, wrong bytes: replaced
    counting = CountingStore(sw_store)
    result = fetch_artifact(published, tmp_path / "stage", store=counting, progress=False)
    assert result.status == "resumed"
    assert result.reused == ["optim/.metadata", "optim/__1_0.distcp", "optim/__2_0.distcp"]
    assert counting.downloaded_keys() == [f"{ARTIFACT_PREFIX}/model.pt", f"{ARTIFACT_PREFIX}/optim/__0_0.distcp"]
    assert result.downloaded_bytes == counting.downloaded_bytes() == 300_000 + 50_000
    assert_identical(artifact, first.path)
    assert staging_record.read_staging(first.path).complete


def test_a_complete_copy_missing_a_file_is_completed_not_trusted(artifact, published, sw_store, tmp_path):
    first = fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    (first.path / "optim" / "__2_0.distcp").unlink()
    result = fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    assert result.status == "resumed" and result.downloaded == ["optim/__2_0.distcp"]
    assert_identical(artifact, first.path)


def test_a_symlink_inside_an_own_copy_is_refused(published, sw_store, tmp_path):
    first = fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    (first.path / "model.pt").unlink()
    (first.path / "model.pt").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafePath, match="symlink"):
        fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    assert not (tmp_path / "elsewhere").exists()


def test_an_uri_that_is_not_an_artifact_prefix_is_a_usage_error(sw_store, tmp_path):
    from ckptflow.errors import UsageError

    with pytest.raises(UsageError, match="iter_<N>"):
        fetch_artifact(f"s3://{sw_store.bucket}/proj/checkpoint_artifacts", tmp_path, store=sw_store)
    with pytest.raises(NotFound, match="no artifact at"):
        fetch_artifact(f"s3://{sw_store.bucket}/nothing/iter_000001", tmp_path, store=sw_store)


def test_a_part_another_live_process_is_writing_is_never_taken_or_removed(artifact, published, sw_store, tmp_path):
    import socket
    import subprocess

    first = fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
    record = staging_record.read_staging(first.path)
    staging_record.write_staging(first.path, staging_record.StagingRecord(
        record.source_uri, record.declaration_sha256, record.files, complete=False))
    (first.path / "model.pt").unlink()
    with subprocess.Popen(["sleep", "60"]) as writer:
        host = socket.gethostname().split(".")[0]
        live = first.path / f".model.pt.{host}.{writer.pid}.0123abcd.part"
        live.write_bytes(b"in progress")
        result = fetch_artifact(published, tmp_path / "stage", store=sw_store, progress=False)
        writer.kill()
    assert result.status == "resumed" and result.resumed == [] and result.downloaded == ["model.pt"]
    assert live.read_bytes() == b"in progress"
    assert result.left_beside == []  # a part of an own file is not a user file
    assert_identical(artifact, first.path)


def test_a_staged_file_changed_in_place_is_not_already_staged(artifact, tmp_path):
    """Same size, other bytes: the complete copy's record and sizes still match, its content does not."""
    (tmp_path / "archive").mkdir()
    publish_artifact(artifact, LocalStore(tmp_path / "archive"), UPLOAD_PREFIX, progress=False)
    uri = f"file://{tmp_path}/archive/{ARTIFACT_PREFIX}"
    staged = fetch_artifact(uri, tmp_path / "stage", progress=False).path
    data = bytearray((staged / "model.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (staged / "model.pt").write_bytes(bytes(data))

    again = fetch_artifact(uri, tmp_path / "stage", progress=False)
    assert again.status == "resumed" and again.downloaded == ["model.pt"]
    assert sorted(again.reused) == [p for p in PAYLOADS if p != "model.pt"]
    assert_identical(artifact, staged)
    assert staging_record.read_staging(staged).complete
    assert fetch_artifact(uri, tmp_path / "stage", progress=False).status == "already-staged"
