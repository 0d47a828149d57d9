"""Scrubbing: ``verify --read-data --subset K/N`` and ``--all-under R``, real CLI processes against a real
SeaweedFS and ``file://`` archives. N runs of the slices read every file exactly once; a byte flipped
on the server is a ``mismatch`` and a removed object ``missing`` (exit 1); nothing is written to disk but
each artifact's verification record, so status shows when its bytes were last read back."""

from __future__ import annotations

import pytest

from ckptflow.archive.publish import publish_artifact
from ckptflow.jsonio import validate
from ckptflow.records import receipt as receipt_record
from ckptflow.store.local import LocalStore
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX, make_artifact
from helpers.cli import run_cli, run_cli_counting_writes
from helpers.trees import tree_state

DECLARATION = ".posttrain-archive.json"
N = 3
# The model is read back whole; a verb that wrote it (a temporary copy) would write this much at least.
MODEL_BYTES = 2 * 1024 * 1024


class Archive:
    """An archive the artifact is published to, and the means to damage it behind ckptflow's back."""

    def __init__(self, store, credentials: list[str]):
        self.store, self.credentials = store, credentials

    def flip_byte(self, key: str, offset: int) -> None:
        data = bytearray(self.read(key))
        data[offset] ^= 0x01
        self.write(key, bytes(data))


class S3Archive(Archive):
    def read(self, key: str) -> bytes:
        return self.store._client.get_object(Bucket=self.store.bucket, Key=key)["Body"].read()

    def write(self, key: str, data: bytes) -> None:
        # Same size and the same sha256 metadata: only reading the bytes tells.
        sha = self.store.head(key).sha256
        self.store._client.put_object(Bucket=self.store.bucket, Key=key, Body=data, Metadata={"sha256": sha})


class FileArchive(Archive):
    def read(self, key: str) -> bytes:
        return (self.store.root / key).read_bytes()

    def write(self, key: str, data: bytes) -> None:
        (self.store.root / key).write_bytes(data)


@pytest.fixture(params=["seaweedfs", "file"])
def archive(request, tmp_path) -> Archive:
    if request.param == "file":
        (tmp_path / "archive").mkdir()
        return FileArchive(LocalStore(tmp_path / "archive"), [])
    store = request.getfixturevalue("sw_store")
    return S3Archive(store, ["--credentials", str(request.getfixturevalue("seaweedfs_credentials_path"))])


@pytest.fixture
def published(tmp_path, archive):
    art = make_artifact(tmp_path / "runs" / "run1", model_bytes=MODEL_BYTES)
    publish_artifact(art, archive.store, UPLOAD_PREFIX, progress=False)
    return art


def scrub(archive: Archive, *args: str):
    proc, written = run_cli_counting_writes("verify", *args, *archive.credentials)
    assert proc.report is not None, proc.stderr[-3000:]
    validate(proc.report, "report_verify", what="verify report")
    return proc, written


def files_of(report: dict) -> list[str]:
    return [o["path"] for o in report["objects"] if o["path"] != DECLARATION]


@pytest.mark.slow
def test_subsets_over_n_runs_read_every_file_once_and_catch_one_flipped_byte(published, archive):
    recorded = {f.path: f.size for f in receipt_record.read_receipt(published).files}
    shard = "optim/__1_0.distcp"
    archive.flip_byte(f"{ARTIFACT_PREFIX}/{shard}", 1234)
    before = tree_state(published)

    runs = {k: scrub(archive, "--artifact-dir", str(published), "--read-data", "--subset", f"{k}/{N}")
            for k in range(1, N + 1)}

    seen = [path for proc, _ in runs.values() for path in files_of(proc.report)]
    assert sorted(seen) == sorted(recorded), "the slices must cover every file exactly once"
    declaration = len(archive.read(f"{ARTIFACT_PREFIX}/{DECLARATION}"))
    # every object read once; the damaged shard fails its part digest, and a failed object counts no bytes
    assert sum(p.report["bytes_read"] for p, _ in runs.values()) == sum(recorded.values()) - recorded[shard] + N * declaration
    for k, (proc, written) in runs.items():
        assert proc.report["subset"] == f"{k}/{N}" and proc.report["read_data"] is True
        assert proc.report["objects"][0] == {"path": DECLARATION, "key": f"{ARTIFACT_PREFIX}/{DECLARATION}",
                                             "state": "ok"}
        bad = {o["path"]: o["state"] for o in proc.report["objects"] if o["state"] != "ok"}
        if shard in files_of(proc.report):
            assert bad == {shard: "mismatch"} and proc.returncode == 1 and proc.report["status"] == "failed"
            assert shard in proc.stderr and "mismatch" in proc.stderr
        else:
            assert bad == {} and proc.returncode == 0 and proc.report["status"] == "verified"
        assert written < 64 * 1024, f"slice {k} wrote {written} bytes: a scrub writes nothing but its report"
    # Nothing of the artifact changes; the slice that found the damage recorded it for status.
    from ckptflow.records import verification as verification_record

    assert verification_record.read_verification(published).status == "failed"
    assert {rel: state for rel, state in tree_state(published).items() if rel != verification_record.FILENAME} == before

    # The same slices on another day: an object's slice is a function of its key alone.
    again = run_cli("verify", "--artifact-dir", str(published), "--read-data", "--subset", f"1/{N}",
                    *archive.credentials)
    assert files_of(again.report) == files_of(runs[1][0].report)


def test_a_removed_object_is_missing_and_fails_the_scrub(published, archive):
    archive.store.delete(f"{ARTIFACT_PREFIX}/model.pt")
    proc, _ = scrub(archive, "--artifact-dir", str(published), "--read-data")
    states = {o["path"]: o["state"] for o in proc.report["objects"]}
    assert states.pop("model.pt") == "missing" and set(states.values()) == {"ok"}
    assert proc.returncode == 1 and proc.report["status"] == "failed"
    assert proc.report["bytes_read"] == sum(f.size for f in receipt_record.read_receipt(published).files
                                            if f.path != "model.pt") + len(archive.read(
                                                f"{ARTIFACT_PREFIX}/{DECLARATION}"))


def test_an_intact_archive_scrubs_clean_with_its_figures(published, archive):
    proc, _ = scrub(archive, "--artifact-dir", str(published), "--read-data")
    assert proc.returncode == 0 and proc.report["status"] == "verified"
    assert {o["state"] for o in proc.report["objects"]} == {"ok"} and proc.report["subset"] is None
    assert proc.report["bytes_read"] > MODEL_BYTES and proc.report["seconds"] > 0
    assert proc.report["throughput_mib_s"] > 0


@pytest.mark.slow
def test_subset_without_read_data_is_a_usage_error(published, archive):
    proc = run_cli("verify", "--artifact-dir", str(published), "--subset", "1/2", *archive.credentials)
    assert proc.returncode == 2 and "--read-data" in proc.stderr
    for bad in ("0/3", "4/3", "1", "a/b"):
        proc = run_cli("verify", "--artifact-dir", str(published), "--read-data", "--subset", bad,
                       *archive.credentials, json_report=False)
        assert proc.returncode == 2 and "K/N" in proc.stderr


@pytest.mark.slow
def test_all_under_scrubs_every_published_artifact_of_a_runs_root(tmp_path, archive):
    runs = tmp_path / "runs"
    first = make_artifact(runs / "run1", iteration=300, seed=1)
    second = make_artifact(runs / "run1", iteration=400, seed=2)
    unpublished = make_artifact(runs / "run1", iteration=500, seed=3)
    for art in (first, second):
        publish_artifact(art, archive.store, UPLOAD_PREFIX, progress=False)
    recorded = {(str(a), f.path) for a in (first, second) for f in receipt_record.read_receipt(a).files}

    seen = []
    for k in (1, 2):
        proc, written = scrub(archive, "--all-under", str(runs), "--subset", f"{k}/2")
        assert proc.returncode == 0, proc.stderr[-3000:]
        rows = {row["artifact_dir"]: row for row in proc.report["artifacts"]}
        assert rows[str(unpublished)]["status"] == "skipped"
        assert {rows[str(a)]["status"] for a in (first, second)} == {"verified"}
        seen += [(d, o["path"]) for d, row in rows.items() for o in row.get("objects", []) if o["path"] != DECLARATION]
        assert written < 64 * 1024
    assert sorted(seen) == sorted(recorded)

    key = f"{ARTIFACT_PREFIX.replace('iter_000300', 'iter_000400')}/optim/__0_0.distcp"
    archive.flip_byte(key, 7)
    proc, _ = scrub(archive, "--all-under", str(runs))
    assert proc.returncode == 1 and proc.report["status"] == "failed" and proc.report["subset"] is None
    rows = {row["artifact_dir"]: row for row in proc.report["artifacts"]}
    assert rows[str(first)]["status"] == "verified" and rows[str(second)]["status"] == "failed"
    assert [(o["path"], o["state"]) for o in rows[str(second)]["objects"] if o["state"] != "ok"] == [
        ("optim/__0_0.distcp", "mismatch")]
    assert str(second) in proc.stderr



@pytest.mark.slow
def test_a_scrub_sets_the_verified_age_status_shows_and_a_slice_records_only_damage(tmp_path, archive):
    from ckptflow.records import verification as verification_record
    from ckptflow.status import collect_status

    runs = tmp_path / "runs"
    first = make_artifact(runs / "run1", iteration=300, seed=1)
    second = make_artifact(runs / "run1", iteration=400, seed=2)
    for art in (first, second):
        publish_artifact(art, archive.store, UPLOAD_PREFIX, progress=False)
    _, receipt_sha = receipt_record.read_receipt_digest(first)
    old = verification_record.Verification("verified", "2026-01-01T00:00:00Z", False, 7, 0, receipt_sha)
    verification_record.write_verification(first, old)

    def verified(art):
        row = next(r for r in collect_status(runs).to_report()["rows"] if r["artifact_dir"] == str(art))
        return row["verified"]

    proc, _ = scrub(archive, "--all-under", str(runs), "--subset", "1/2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert verification_record.read_verification(first) == old  # a clean slice proves nothing of the rest
    assert not verification_record.path_in(second).exists()

    proc, _ = scrub(archive, "--all-under", str(runs))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for art in (first, second):
        record = verification_record.read_verification(art)
        assert (record.status, record.read_data) == ("verified", True) and record.verified_at > old.verified_at
        assert (verified(art)["state"], verified(art)["at"]) == ("verified", record.verified_at)

    archive.flip_byte(f"{ARTIFACT_PREFIX.replace('iter_000300', 'iter_000400')}/optim/__0_0.distcp", 7)
    outcomes = []
    for k in (1, 2):
        before = verification_record.path_in(second).read_bytes()
        proc, _ = scrub(archive, "--all-under", str(runs), "--subset", f"{k}/2")
        outcomes.append(proc.returncode)
        if proc.returncode == 0:
            assert verification_record.path_in(second).read_bytes() == before
        else:
            assert verification_record.read_verification(second).status == "failed"
    assert sorted(outcomes) == [0, 1]  # the damaged file is in one slice, and only that slice fails
    assert verified(second)["state"] == "failed" and verified(first)["state"] == "verified"


def put_without_metadata(archive: Archive, key: str, data: bytes) -> None:
    """Store ``data`` at ``key`` with no ``sha256`` metadata (S3: a plain PUT; file://: no metadata sidecar)."""
    if isinstance(archive, S3Archive):
        archive.store._client.put_object(Bucket=archive.store.bucket, Key=key, Body=data)
        return
    archive.write(key, data)
    obj = archive.store.root / key
    (obj.parent / ".ckptflow-meta" / f"{obj.name}.json").unlink()


def test_a_scrub_reads_an_object_without_sha256_metadata_and_holds_it_to_the_declaration(published, archive):
    """Bytes were asked for and the declaration holds every digest: an object stored without ``sha256``
    metadata is read, not skipped as unverifiable; other bytes there are a mismatch."""
    same, other = "optim/.metadata", "optim/__0_0.distcp"
    damaged = bytearray(archive.read(f"{ARTIFACT_PREFIX}/{other}"))
    damaged[10] ^= 0x01
    put_without_metadata(archive, f"{ARTIFACT_PREFIX}/{same}", archive.read(f"{ARTIFACT_PREFIX}/{same}"))
    put_without_metadata(archive, f"{ARTIFACT_PREFIX}/{other}", bytes(damaged))
    proc, _ = scrub(archive, "--artifact-dir", str(published), "--read-data")
    objects = {o["path"]: o for o in proc.report["objects"]}
    assert objects[other]["state"] == "mismatch" and proc.returncode == 1
    assert {o["state"] for p, o in objects.items() if p not in (same, other)} == {"ok"}
    # every object is read whole but the damaged one, whose reading stops at its first part that fails
    assert proc.report["bytes_read"] >= sum(f.size for f in receipt_record.read_receipt(published).files
                                            if f.path != other)
    if isinstance(archive, S3Archive):  # the server checksum recorded at publication is gone: replaced
        assert objects[same]["state"] == "changed"
    else:
        assert objects[same] == {"path": same, "key": f"{ARTIFACT_PREFIX}/{same}", "state": "ok",
                                 "detail": "no sha256 metadata; its bytes, read back, are the declared ones"}
