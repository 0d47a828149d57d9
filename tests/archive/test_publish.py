"""publish: selection, hash-and-check, declaration first, manifest last, receipt after verification."""

from __future__ import annotations

import base64
import hashlib

import pytest
from archive_helpers import remote_snapshot

from ckptflow.archive.keys import artifact_prefix
from ckptflow.archive.publish import publish_artifact
from ckptflow.errors import NotFound, Refused, UnsafePath, VerificationFailed
from ckptflow.fsutil import walk_files
from ckptflow.records import declaration as declaration_record
from ckptflow.records import manifest as manifest_record
from ckptflow.records import receipt as receipt_record
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact

SELECTED = [
    ".posttrain-archive.json",
    ".posttrain-checkpoint-artifact.json",
    ".posttrain-part-digests.json",  # the part digests record publish writes beside the manifest
    "model.pt",
    "optim/.metadata",
    "optim/__0_0.distcp",
    "optim/__1_0.distcp",
    "optim/__2_0.distcp",
]


def keys(store, prefix=ARTIFACT_PREFIX):
    return [o.key.removeprefix(prefix + "/") for o in store.list(prefix + "/")]


def test_artifact_goes_to_the_sibling_checkpoint_artifacts_prefix():
    assert artifact_prefix("p/g/r/ts/checkpoints", "iter_000300") == "p/g/r/ts/checkpoint_artifacts/iter_000300"
    assert artifact_prefix("/p/g/r/ts/checkpoints/", "iter_000001") == "p/g/r/ts/checkpoint_artifacts/iter_000001"


def test_publish_archives_exactly_the_selected_files_and_writes_the_receipt(artifact, any_store):
    result = publish_artifact(artifact, any_store, UPLOAD_PREFIX, progress=False)
    assert result.status == "published"
    assert keys(any_store) == SELECTED  # the stale optim.pt stays out
    receipt = receipt_record.read_receipt(artifact)
    assert receipt.destination.prefix == ARTIFACT_PREFIX
    assert [f.path for f in receipt.files] == [p for p in SELECTED if p != ".posttrain-archive.json"]
    remote_decl = any_store.get_bytes(f"{ARTIFACT_PREFIX}/.posttrain-archive.json")
    assert hashlib.sha256(remote_decl).hexdigest() == receipt.declaration_sha256
    # the part digests record: written beside the manifest, archived byte for byte, bound by the declaration
    record = (artifact / ".posttrain-part-digests.json").read_bytes()
    assert any_store.get_bytes(f"{ARTIFACT_PREFIX}/.posttrain-part-digests.json") == record
    assert receipt.entry(".posttrain-part-digests.json").sha256 == hashlib.sha256(record).hexdigest()
    decl = declaration_record.parse_declaration(remote_decl)
    local_manifest = manifest_record.path_in(artifact).read_bytes()
    assert any_store.get_bytes(f"{ARTIFACT_PREFIX}/.posttrain-checkpoint-artifact.json") == local_manifest
    assert decl.manifest_sha256 == hashlib.sha256(local_manifest).hexdigest()
    for entry in decl.files:
        info = any_store.head(f"{ARTIFACT_PREFIX}/{entry.path}")
        assert (info.size, info.sha256) == (entry.size, entry.sha256)


def test_republishing_a_published_artifact_is_skipped_but_still_verified(artifact, sw_store):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    again = publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert again.status == "skipped" and again.uploaded == []
    sw_store.delete(f"{ARTIFACT_PREFIX}/optim/__1_0.distcp")
    with pytest.raises(VerificationFailed, match=r"__1_0\.distcp"):
        publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)


def test_committed_identical_archive_without_receipt_is_adopted(artifact, sw_store):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    before = remote_snapshot(sw_store)
    receipt_record.path_in(artifact).unlink()
    result = publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert result.status == "adopted" and result.uploaded == []
    assert receipt_record.path_in(artifact).exists()
    assert remote_snapshot(sw_store) == before


def test_payload_contradicting_its_manifest_is_refused_before_any_remote_write(artifact, sw_store):
    data = bytearray((artifact / "optim" / "__0_0.distcp").read_bytes())
    data[100] ^= 0xFF
    (artifact / "optim" / "__0_0.distcp").write_bytes(bytes(data))
    with pytest.raises(Refused, match=r"__0_0\.distcp contradicts"):
        publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert sw_store.list("") == []
    assert not receipt_record.path_in(artifact).exists()


def test_missing_file_digest_is_added_to_the_manifest_before_anything_remote(artifact, sw_store):
    m = manifest_record.read_manifest(artifact)
    comps = dict(m.components)
    comps["model"] = manifest_record.FileComponent(comps["model"].path, comps["model"].size, None)
    manifest_record.write_manifest(artifact, manifest_record.Manifest(m.iteration, comps, m.producer))
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    filled = manifest_record.read_manifest(artifact)
    assert filled.components["model"].sha256 == hashlib.sha256((artifact / "model.pt").read_bytes()).hexdigest()
    assert sw_store.get_bytes(f"{ARTIFACT_PREFIX}/{manifest_record.FILENAME}") == manifest_record.path_in(artifact).read_bytes()


def test_different_inventory_at_the_same_destination_is_refused_and_the_declaration_kept(artifact, sw_store, tmp_path):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    decl_key = f"{ARTIFACT_PREFIX}/.posttrain-archive.json"
    before = sw_store.get_bytes(decl_key)
    other = make_artifact(tmp_path / "other-run", seed=7)
    with pytest.raises(Refused, match="declares different contents") as err:
        publish_artifact(other, sw_store, UPLOAD_PREFIX, progress=False)
    assert hashlib.sha256(before).hexdigest() in str(err.value)
    assert sw_store.get_bytes(decl_key) == before
    assert not receipt_record.path_in(other).exists()


def test_abandoned_declaration_still_blocks_different_contents(artifact, sw_store, tmp_path):
    """A declaration left by a failed attempt is permanent: it never authorizes replacing contents."""
    other = make_artifact(tmp_path / "other-run", seed=7)
    from ckptflow.archive.publish import build_local_inventory

    inv = build_local_inventory(other, progress=False)
    sw_store.put_bytes_create_once(f"{ARTIFACT_PREFIX}/.posttrain-archive.json", inv.declaration_bytes,
                                   sha256=hashlib.sha256(inv.declaration_bytes).hexdigest())
    with pytest.raises(Refused, match="another destination"):
        publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert keys(sw_store) == [".posttrain-archive.json"]


def test_symlink_inside_the_artifact_is_refused(artifact, sw_store, tmp_path):
    target = artifact / "optim" / "__2_0.distcp"
    moved = tmp_path / "moved.distcp"
    target.rename(moved)
    target.symlink_to(moved)
    with pytest.raises(UnsafePath, match="symlink"):
        publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert sw_store.list("") == []


def test_uncommitted_artifact_is_not_published(tmp_path, sw_store):
    art = tmp_path / "checkpoint_artifacts" / "iter_000300"
    art.mkdir(parents=True)
    (art / "model.pt").write_bytes(b"x")
    with pytest.raises(NotFound, match="not committed"):
        publish_artifact(art, sw_store, UPLOAD_PREFIX, progress=False)


def test_merge_record_and_its_diagnostic_are_archived(artifact, sw_store):
    from ckptflow.records import merge_record

    model = manifest_record.read_manifest(artifact).components["model"]
    (artifact / "diag.json").write_text('{"tensors": {}}\n')
    rec = merge_record.MergeRecord.from_dict(
        {
            "protocol": merge_record.PROTOCOL,
            "tool_version": "ckptflow-merge/1",
            "request": {
                "mode": "avg",
                "experts": [{"path": "/e/a/model.pt", "size": 1, "sha256": "a" * 64}],
                "base": None,
                "lam": None,
                "iteration": 300,
            },
            "outputs": [{"path": "model.pt", "size": model.size, "sha256": model.sha256}],
            "diag": "diag.json",
        }
    )
    merge_record.write_merge_record(artifact, rec)
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert {".merge-complete.json", "diag.json"} <= set(keys(sw_store))


def test_delete_local_removes_payloads_only_after_verification(artifact, sw_store):
    from ckptflow.archive.probe import run_probe

    assert run_probe(sw_store, "scratch").record.passed
    result = publish_artifact(artifact, sw_store, UPLOAD_PREFIX, delete_local=True, progress=False)
    assert result.status == "published"
    assert sorted(result.removed) == ["model.pt", "optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp", "optim/__2_0.distcp"]
    assert result.freed_bytes == sum(e.size for e in result.inventory if e.path in result.removed)
    left = list(walk_files(artifact))
    assert left == [".posttrain-checkpoint-artifact.json", ".posttrain-part-digests.json", ".uploaded", "optim.pt"]


@pytest.mark.parametrize("shape", ["model", "components"])
def test_legacy_merge_manifest_is_converted_and_its_original_bytes_archived(tmp_path, sw_store, shape):
    art = tmp_path / "run1" / "checkpoint_artifacts" / "iter_000300"
    art.mkdir(parents=True)
    (art / "model.pt").write_bytes(b"legacy merged weights" * 100)
    size = (art / "model.pt").stat().st_size
    if shape == "model":
        legacy = b'{"iteration": 300, "model": "model.pt", "merged_by": "merge_model_pt.py"}'
    else:
        legacy = b'{"components": {"model": {"format": "file", "path": "model.pt", "size": %d}}, "iteration": 300}' % size
    manifest_record.path_in(art).write_bytes(legacy)
    result = publish_artifact(art, sw_store, UPLOAD_PREFIX, progress=False)
    assert result.status == "published"
    assert (art / ".posttrain-checkpoint-artifact.legacy.json").read_bytes() == legacy
    native = manifest_record.read_manifest(art)
    assert native.components["model"].sha256 == hashlib.sha256((art / "model.pt").read_bytes()).hexdigest()
    assert sw_store.get_bytes(f"{ARTIFACT_PREFIX}/.posttrain-checkpoint-artifact.legacy.json") == legacy


def test_preserved_legacy_bytes_are_never_overwritten(tmp_path, sw_store):
    art = tmp_path / "run1" / "checkpoint_artifacts" / "iter_000300"
    art.mkdir(parents=True)
    (art / "model.pt").write_bytes(b"w")
    manifest_record.path_in(art).write_bytes(b'{"iteration": 300, "model": "model.pt"}')
    (art / ".posttrain-checkpoint-artifact.legacy.json").write_bytes(b'{"iteration": 299, "model": "model.pt"}')
    from ckptflow.errors import ConflictError

    with pytest.raises(ConflictError, match="never overwrites"):
        publish_artifact(art, sw_store, UPLOAD_PREFIX, progress=False)
    assert (art / ".posttrain-checkpoint-artifact.legacy.json").read_bytes() == b'{"iteration": 299, "model": "model.pt"}'


def test_conflicting_committed_prefix_is_refused_without_any_write(artifact, sw_store, tmp_path):
    """A destination committed by another artifact (here without a declaration) is never modified."""
    other = make_artifact(tmp_path / "other-run", seed=5)
    key = f"{ARTIFACT_PREFIX}/{manifest_record.FILENAME}"
    other_manifest = manifest_record.path_in(other).read_bytes()
    sw_store.put_bytes_create_once(key, other_manifest, sha256=hashlib.sha256(other_manifest).hexdigest())
    from ckptflow.errors import ConflictError

    with pytest.raises(ConflictError, match="another destination"):
        publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert keys(sw_store) == [manifest_record.FILENAME]
    assert not receipt_record.path_in(artifact).exists()


@pytest.mark.seaweedfs
def test_publish_hashes_each_payload_once_and_the_server_checks_every_part(
        tmp_path, seaweedfs_bucket, seaweedfs_credentials_path) -> None:
    """The hashing pass also takes the per-part digests; each part goes with its digest (the server
    refuses a part whose bytes changed since) and without a second hash of the body for the signature."""
    from ckptflow.store import load_credentials

    mib = 1024 * 1024
    art = make_artifact(tmp_path, model_bytes=12 * mib)
    store = S3Store(seaweedfs_bucket, load_credentials(seaweedfs_credentials_path),
                    multipart_threshold=5 * mib, part_size=5 * mib)
    parts: list[dict[str, str]] = []

    def record(request, **_):
        headers = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
        if int(headers["content-length"]) >= mib:  # model.pt's parts, not the store's one-off check
            parts.append(headers)

    for client in (store._client, store._unsigned()):
        client.meta.events.register("before-send.s3.UploadPart", record)
    assert publish_artifact(art, store, UPLOAD_PREFIX, progress=False).status == "published"
    data = (art / "model.pt").read_bytes()
    expected = sorted(hashlib.sha256(data[i:i + 5 * mib]).digest() for i in range(0, len(data), 5 * mib))
    assert sorted(base64.b64decode(p["x-amz-checksum-sha256"]) for p in parts) == expected
    assert {p["x-amz-content-sha256"] for p in parts} == {"UNSIGNED-PAYLOAD"}
    assert store.head(f"{ARTIFACT_PREFIX}/model.pt").sha256 == hashlib.sha256(data).hexdigest()


def _prune_locally(artifact):
    """What prune-verified leaves: the manifest's payload files gone, every record kept."""
    for entry in manifest_record.read_manifest(artifact).physical_files():
        (artifact / entry.path).unlink()


def test_a_pruned_artifact_whose_receipt_was_lost_is_adopted_from_its_manifest_digests(artifact, any_store):
    publish_artifact(artifact, any_store, UPLOAD_PREFIX, progress=False)
    before = receipt_record.read_receipt(artifact)
    remote = remote_snapshot(any_store)
    _prune_locally(artifact)
    receipt_record.path_in(artifact).unlink()  # e.g. removed by a workflow rerun
    result = publish_artifact(artifact, any_store, UPLOAD_PREFIX, progress=False)
    assert result.status == "adopted" and result.uploaded == []
    after = receipt_record.read_receipt(artifact)
    assert (after.destination, after.declaration_sha256, after.files) == (
        before.destination, before.declaration_sha256, before.files)
    assert remote_snapshot(any_store) == remote
    assert publish_artifact(artifact, any_store, UPLOAD_PREFIX, progress=False).status == "skipped"


def test_a_pruned_artifact_is_refused_where_its_archive_is_not_and_nothing_is_written(artifact, sw_store, tmp_path):
    local = LocalStore(tmp_path / "first-archive")
    (tmp_path / "first-archive").mkdir()
    publish_artifact(artifact, local, UPLOAD_PREFIX, progress=False)
    _prune_locally(artifact)
    receipt_record.path_in(artifact).unlink()
    with pytest.raises(NotFound, match=r"gone locally .* holds no \.posttrain-archive\.json") as err:
        publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert "model.pt" in str(err.value) and "--" not in str(err.value)
    assert sw_store.list("") == []
    other = make_artifact(tmp_path / "other-run", seed=7)
    publish_artifact(other, sw_store, UPLOAD_PREFIX, progress=False)
    remote = remote_snapshot(sw_store)
    with pytest.raises(Refused, match="is not this artifact's"):
        publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert remote_snapshot(sw_store) == remote and not receipt_record.path_in(artifact).exists()


def test_adopting_a_pruned_artifact_still_head_verifies_the_whole_remote_inventory(artifact, sw_store):
    publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    _prune_locally(artifact)
    receipt_record.path_in(artifact).unlink()
    sw_store.delete(f"{ARTIFACT_PREFIX}/optim/__1_0.distcp")
    with pytest.raises(VerificationFailed, match=r"__1_0\.distcp"):
        publish_artifact(artifact, sw_store, UPLOAD_PREFIX, progress=False)
    assert not receipt_record.path_in(artifact).exists()
