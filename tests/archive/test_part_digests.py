"""Part digests on every verified read: a byte flipped in any one part of a stored object (the first part,
a middle part, the last short part; a multipart object, a single-PUT object, a file of one short part;
SeaweedFS and ``file://``) is caught by fetch, restore, ``verify --read-data``, prune's read-back and a
scrub, naming the file and the damaged part's byte range. A range whose parts fail is read once more;
a fetch of an archive with part digests hashes no file whole; archives without them (published before)
read, restore, scrub and republish as before; a record that is not the one the declaration binds is
refused by name."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import threading
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest
from archive_helpers import CountingStore

import ckptflow.digest as digest_mod
from ckptflow.archive import publish_inventory
from ckptflow.archive.fetch import fetch_artifact
from ckptflow.archive.keys import artifact_prefix, object_key
from ckptflow.archive.part_digests import load_part_digests
from ckptflow.archive.prune import prune_verified
from ckptflow.archive.publish import publish_artifact
from ckptflow.archive.publish_inventory import build_local_inventory
from ckptflow.archive.restore import restore_artifact
from ckptflow.archive.scrub import scrub_runs_root
from ckptflow.archive.stage import verified_prefix
from ckptflow.archive.verify import verify_artifact
from ckptflow.digest import PartDigests, hash_threads, part_digest_size, sha256_bytes
from ckptflow.errors import InvalidRecord, StoreError, VerificationFailed
from ckptflow.fsutil import walk_files
from ckptflow.records import declaration as declaration_record
from ckptflow.records import manifest as manifest_record
from ckptflow.records import part_digests as part_digests_record
from ckptflow.records import receipt as receipt_record
from ckptflow.records import staging as staging_record
from ckptflow.records.inventory import FileEntry
from ckptflow.store.credentials import load_credentials
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from helpers import servers
from helpers.artifacts import make_artifact, publish_without_part_digests
from helpers.cli import run_cli

MiB = 1024 * 1024
MODEL, SHARD = "model.pt", "optim/__1_0.distcp"
MODEL_BYTES = 20 * MiB  # parts of 8, 8 and 4 MiB; multipart on S3 (threshold 16 MiB) unless raised
SHARD_BYTES = 50_001  # make_artifact's second shard: one short part, always a single PUT
RECORD = part_digests_record.FILENAME
PAYLOADS = ["model.pt", "optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp", "optim/__2_0.distcp"]
# The declaration schema as the seed's v1 readers know it: a frozen copy, never updated with the source's.
V1_DECLARATION_SCHEMA = Path(__file__).resolve().parents[1] / "records" / "v1" / "declaration.schema.json"

# Where a byte is flipped: (file, offset, the damaged part as every message names it).
SPOTS = {
    "first-part": (MODEL, 1234, "bytes 0-8388607 (part 1 of 3)"),
    "middle-part": (MODEL, 8 * MiB + 4321, "bytes 8388608-16777215 (part 2 of 3)"),
    "last-short-part": (MODEL, MODEL_BYTES - 7, "bytes 16777216-20971519 (part 3 of 3)"),
    "one-short-part": (SHARD, 1234, f"bytes 0-{SHARD_BYTES - 1} (part 1 of 1)"),
}
# s3-multipart: model.pt is a 3-part multipart object; s3-single-put: the threshold is raised, so it is one
# PUT (the shard is a single PUT in both, so its cell runs once, under s3-multipart); file: bytes in a file.
FORMS = {
    "s3-multipart": list(SPOTS),
    "s3-single-put": ["first-part", "middle-part", "last-short-part"],
    "file": list(SPOTS),
}
READS = ["fetch", "restore", "verify", "prune-read-back", "scrub"]
CELLS = [(form, spot, read) for form, spots in FORMS.items() for spot in spots for read in READS]


def upload_prefix(tag: str) -> str:
    return f"{tag}/proj/group/run1/20261129T000000Z/checkpoints"


@dataclass
class Archive:
    """One artifact published to one store, and the means to damage its objects behind ckptflow's back."""

    form: str
    store: object
    artifact: Path  # the published artifact; its receipt names this archive
    prefix: str

    @property
    def s3(self) -> bool:
        return isinstance(self.store, S3Store)

    @property
    def uri(self) -> str:
        if self.s3:
            return f"s3://{self.store.bucket}/{self.prefix}"
        return f"file://{self.store.root}/{self.prefix}"

    def key(self, rel: str) -> str:
        return object_key(self.prefix, rel)

    def read(self, rel: str) -> bytes:
        if self.s3:
            return self.store._client.get_object(Bucket=self.store.bucket, Key=self.key(rel))["Body"].read()
        return (self.store.root / self.key(rel)).read_bytes()

    def etag(self, rel: str) -> str:
        return self.store._client.head_object(Bucket=self.store.bucket, Key=self.key(rel))["ETag"]

    def write(self, rel: str, data: bytes) -> None:
        """Replace the object's bytes: on S3 with the same sha256 metadata and no server checksum, a multipart
        object again as a multipart upload of 8 MiB parts; on ``file://`` the stored file in place."""
        if not self.s3:
            (self.store.root / self.key(rel)).write_bytes(data)
            return
        client, bucket, key = self.store._client, self.store.bucket, self.key(rel)
        meta = {"sha256": self.store.head(key).sha256}
        if "-" not in self.etag(rel):
            client.put_object(Bucket=bucket, Key=key, Body=data, Metadata=meta)
            return
        upload = client.create_multipart_upload(Bucket=bucket, Key=key, Metadata=meta)["UploadId"]
        parts = []
        for n, start in enumerate(range(0, len(data), 8 * MiB), 1):
            got = client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=n,
                                     Body=data[start:start + 8 * MiB])
            parts.append({"PartNumber": n, "ETag": got["ETag"]} | {k: v for k, v in got.items() if k.startswith("Checksum")})
        client.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})

    def flip(self, rel: str, offset: int) -> None:
        data = bytearray(self.read(rel))
        data[offset] ^= 0x01
        self.write(rel, bytes(data))


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def probe_cache(module_cache, monkeypatch) -> Path:
    """Probe records shared by this module's tests (every bucket and root here is this module's own): a
    destination is qualified once, not once per cell."""
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(module_cache))
    return module_cache


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """The pristine artifact every archive of this module is published from (copied, never published itself)."""
    return make_artifact(tmp_path_factory.mktemp("source"), model_bytes=MODEL_BYTES)


@pytest.fixture(scope="module")
def s3_bucket(seaweedfs_credentials_path):
    bucket = f"ckptflow-t-{uuid.uuid4().hex[:16]}"
    servers.create_bucket(seaweedfs_credentials_path, bucket)
    yield bucket
    servers.remove_bucket(seaweedfs_credentials_path, bucket)


def link_copy(artifact: Path, root: Path) -> Path:
    """``artifact`` at ``root/run1/checkpoint_artifacts/<name>`` (a runs root a scrub walks), its files hard
    links: a release or a restore there replaces names, never the bytes of the original."""
    dest = root / "run1" / "checkpoint_artifacts" / artifact.name
    shutil.copytree(artifact, dest, copy_function=os.link)
    return dest


def open_store(form: str, bucket: str, credentials_path: Path, root: Path):
    if form == "file":
        root.mkdir(parents=True, exist_ok=True)
        return LocalStore(root)
    threshold = 64 * MiB if form == "s3-single-put" else 16 * MiB
    return S3Store(bucket, load_credentials(credentials_path), multipart_threshold=threshold)


@pytest.fixture(scope="module")
def damaged(source, s3_bucket, seaweedfs_credentials_path, tmp_path_factory):
    """``damaged(form, spot)``: an archive of its own, published once, with the byte of ``spot`` flipped in the
    stored object (same size; on S3 the same sha256 metadata, so HEAD still passes). Cached per module."""
    made: dict[tuple[str, str | None], Archive] = {}

    def get(form: str, spot: str | None) -> Archive:
        if (form, spot) not in made:
            tag = f"{form}-{spot or 'intact'}"
            base = tmp_path_factory.mktemp(tag)
            art = base / "runs" / "run1" / "checkpoint_artifacts" / source.name
            shutil.copytree(source, art)
            store = open_store(form, s3_bucket, seaweedfs_credentials_path, base / "archive")
            publish_artifact(art, store, upload_prefix(tag), progress=False)
            arch = Archive(form, store, art, artifact_prefix(upload_prefix(tag), art.name))
            if spot is not None:
                rel, offset, _ = SPOTS[spot]
                arch.flip(rel, offset)
            made[(form, spot)] = arch
        return made[(form, spot)]

    return get


def no_parts(root: Path) -> list[str]:
    return [p for p in walk_files(root) if p.endswith(".part")] if root.exists() else []


def only_parts_of(root: Path, rel: str) -> bool:
    """Every download part under ``root`` is one of ``rel``'s (``.<name>.<host>.<pid>.<token>.part`` beside
    it): a failed file may leave the part a rerun resumes from, never a part of another file."""
    head, _, name = rel.rpartition("/")
    return all(p.rpartition("/")[0] == head and p.rpartition("/")[2].startswith(f".{name}.") for p in no_parts(root))


@pytest.mark.parametrize(("form", "spot", "read"), CELLS)
def test_a_flipped_byte_in_any_one_part_is_caught_naming_the_file_and_the_part(damaged, form, spot, read, tmp_path):
    arch = damaged(form, spot)
    rel, _, part = SPOTS[spot]
    if arch.s3:  # the cell is what it says: the damaged object is multipart exactly where expected
        assert ("-" in arch.etag(rel)) == (form == "s3-multipart" and rel == MODEL)
    assert arch.store.head(arch.key(rel)).size == (MODEL_BYTES if rel == MODEL else SHARD_BYTES)
    store_for = lambda dest: arch.store  # noqa: E731

    if read == "fetch":
        with pytest.raises(VerificationFailed) as err:
            fetch_artifact(arch.uri, tmp_path / "stage", store=arch.store, progress=False)
        staged = tmp_path / "stage" / arch.artifact.name
        assert not (staged / rel).exists() and only_parts_of(staged, rel)
        assert not (staged / manifest_record.FILENAME).exists()
        assert staging_record.read_staging(staged).complete is False
        message = str(err.value)
    elif read == "restore":
        art = link_copy(arch.artifact, tmp_path / "runs")
        (art / rel).unlink()
        with pytest.raises(VerificationFailed) as err:
            restore_artifact(art, store_for, progress=False)
        assert not (art / rel).exists() and only_parts_of(art, rel)
        message = str(err.value)
    elif read == "verify":
        result = verify_artifact(arch.artifact, store_for, read_data=True)
        assert not result.ok
        states = {o.path: o for o in result.objects}
        assert {p: o.state for p, o in states.items() if o.state != "ok"} == {rel: "mismatch"}
        message = states[rel].detail
    elif read == "prune-read-back":
        art = link_copy(arch.artifact, tmp_path / "runs")
        (art / "optim.pt").unlink()  # make_artifact's stale unselected file, which would keep it anyway
        report = prune_verified([art], store_for, read_data=True, progress=False)
        assert report.removed == [] and report.has_errors
        assert all((art / p).is_file() for p in PAYLOADS), "nothing is released when a read-back fails"
        message = report.kept[0]["reason"]
    else:
        art = link_copy(arch.artifact, tmp_path / "runs")
        result = scrub_runs_root(tmp_path / "runs", store_for)
        assert not result.ok and [r.artifact_dir for r in result.verified] == [art]
        bad = [o for o in result.verified[0].objects if o.state != "ok"]
        assert [(o.path, o.state) for o in bad] == [(rel, "mismatch")]
        message = bad[0].detail
    assert rel in message and part in message, message
    assert "(read twice)" in message, message


# --- a range whose parts fail is read once more --------------------------------------------------------


class FlippingStore(CountingStore):
    """A real store whose first ``times`` reads of the range holding ``offset`` of ``suffix`` return that byte
    flipped; every other read, and later ones of that range, are the stored bytes."""

    def __init__(self, inner, suffix: str, offset: int, times: int):
        super().__init__(inner)
        self.suffix, self.offset, self.times = suffix, offset, times
        self.lock = threading.Lock()

    def open_range(self, key, offset, length):
        opened = super().open_range(key, offset, length)
        if not (key.endswith(self.suffix) and offset <= self.offset < offset + length):
            return opened
        with self.lock:
            if self.times == 0:
                return opened
            self.times -= 1
        return self._flipped(opened, self.offset - offset)

    @staticmethod
    @contextmanager
    def _flipped(opened, at: int):
        with opened as reader:
            yield _FlippingReader(reader, at)

    def reads_of_damaged_range(self) -> int:
        return sum(1 for key, start, end in self.downloads if key.endswith(self.suffix) and start <= self.offset < end)


class _FlippingReader:
    def __init__(self, reader, at: int):
        self.reader, self.at, self.pos = reader, at, 0

    def readinto(self, buf) -> int:
        n = self.reader.readinto(buf)
        if n and self.pos <= self.at < self.pos + n:
            view = memoryview(buf).cast("B")
            view[self.at - self.pos] ^= 0x01
        self.pos += n or 0
        return n


@pytest.mark.parametrize("form", ["s3-multipart", "file"])
def test_a_range_damaged_once_in_transit_is_read_again_and_the_fetch_succeeds(damaged, form, tmp_path, source):
    arch = damaged(form, None)
    flaky = FlippingStore(arch.store, "/" + MODEL, 8 * MiB + 99, times=1)
    result = fetch_artifact(arch.uri, tmp_path / "stage", store=flaky, progress=False)
    assert result.status == "fetched" and staging_record.read_staging(result.path).complete
    assert (result.path / MODEL).read_bytes() == (source / MODEL).read_bytes()
    assert flaky.reads_of_damaged_range() == 2 and flaky.times == 0


@pytest.mark.parametrize("form", ["s3-multipart", "file"])
def test_a_range_damaged_on_every_read_is_read_exactly_twice_then_fails_the_file(damaged, form, tmp_path):
    arch = damaged(form, None)
    flaky = FlippingStore(arch.store, "/" + MODEL, MODEL_BYTES - 1, times=10)
    with pytest.raises(VerificationFailed, match=r"model\.pt: bytes 16777216-20971519 \(part 3 of 3\).*\(read twice\)"):
        fetch_artifact(arch.uri, tmp_path / "stage", store=flaky, progress=False)
    assert flaky.reads_of_damaged_range() == 2
    staged = tmp_path / "stage" / arch.artifact.name
    assert not (staged / MODEL).exists() and only_parts_of(staged, MODEL)
    assert staging_record.read_staging(staged).complete is False


# --- no whole-file SHA-256 where part digests are declared ---------------------------------------------


@contextmanager
def sha256_bytes_fed(monkeypatch):
    """Count every byte any ``hashlib.sha256`` object is fed, wherever in ckptflow it is made."""
    real = hashlib.sha256
    fed = []

    class Counting:
        def __init__(self, data=b"", **kw):
            self._h = real(**kw)
            self.update(data)

        def update(self, data) -> None:
            fed.append(memoryview(data).nbytes)
            self._h.update(data)

        def __getattr__(self, name):
            return getattr(self._h, name)

    with monkeypatch.context() as m:
        m.setattr(hashlib, "sha256", Counting)
        yield fed


@pytest.mark.parametrize("form", ["s3-multipart", "file"])
@pytest.mark.parametrize("components", [None, ("model",)], ids=["whole", "model-only"])  # model-only: materialize's
def test_a_fetch_of_an_archive_with_part_digests_hashes_no_file_whole(damaged, form, components, tmp_path, source,
                                                                     monkeypatch):
    arch = damaged(form, None)
    checked = []
    real_blake3 = digest_mod.blake3_digest
    monkeypatch.setattr(digest_mod, "blake3_digest", lambda view: checked.append(len(view)) or real_blake3(view))
    with sha256_bytes_fed(monkeypatch) as fed:
        result = fetch_artifact(arch.uri, tmp_path / "stage", store=arch.store, progress=False, components=components)
    assert result.status == "fetched"
    assert (result.path / MODEL).read_bytes() == (source / MODEL).read_bytes()
    # Only the small records (declaration, manifest, part digests record) go through SHA-256.
    assert sum(fed) < 64 * 1024, f"{sum(fed)} bytes hashed with SHA-256"
    fetched = [MODEL] if components else PAYLOADS
    assert sum(checked) == sum((source / p).stat().st_size for p in fetched)  # every byte in a checked part


@pytest.fixture(params=["s3-multipart", "file"])
def old_form(request, tmp_path, source) -> Archive:
    """The source published as a publisher before part digests did, to a SeaweedFS bucket or a ``file://``
    root of its own."""
    art = tmp_path / "runs" / "run1" / "checkpoint_artifacts" / source.name
    shutil.copytree(source, art)
    if request.param == "file":
        store = open_store("file", "", Path(), tmp_path / "archive")
    else:
        store = request.getfixturevalue("sw_store")
    publish_without_part_digests(art, store, upload_prefix("old"))
    return Archive(request.param, store, art, artifact_prefix(upload_prefix("old"), art.name))


def test_an_old_form_archive_is_hashed_whole_on_fetch_and_a_flipped_byte_is_still_caught(old_form, tmp_path,
                                                                                          source, monkeypatch):
    with sha256_bytes_fed(monkeypatch) as fed:
        result = fetch_artifact(old_form.uri, tmp_path / "good", store=old_form.store, progress=False)
    assert result.status == "fetched" and (result.path / MODEL).read_bytes() == (source / MODEL).read_bytes()
    assert sum(fed) >= MODEL_BYTES  # the SHA-256 path: each file hashed whole
    old_form.flip(MODEL, 8 * MiB + 4321)
    with pytest.raises(VerificationFailed, match=r"model\.pt") as err:
        fetch_artifact(old_form.uri, tmp_path / "bad", store=old_form.store, progress=False)
    assert "partial download was removed" in str(err.value)
    staged = tmp_path / "bad" / source.name
    assert not (staged / MODEL).exists() and staging_record.read_staging(staged).complete is False


# --- compatibility ---------------------------------------------------------------------------------------


def test_an_old_form_archive_fetches_restores_scrubs_and_republishes_as_before(old_form, source, tmp_path):
    art, store = old_form.artifact, old_form.store
    plain = build_local_inventory(source, progress=False, write=False).without_part_digests()
    assert old_form.read(declaration_record.FILENAME) == plain.declaration_bytes
    assert RECORD not in [e.path for e in receipt_record.read_receipt(art).files]
    assert not part_digests_record.path_in(art).exists(), "no record is written for an old-form archive"
    assert store.head(old_form.key(RECORD)) is None

    fetched = fetch_artifact(old_form.uri, tmp_path / "stage", store=store, progress=False)
    assert fetched.status == "fetched" and fetched.plan.part_digests == {}
    for rel in [*PAYLOADS, manifest_record.FILENAME]:
        assert (fetched.path / rel).read_bytes() == (source / rel).read_bytes(), rel
    assert staging_record.read_staging(fetched.path).complete

    scrubbed = scrub_runs_root(tmp_path / "runs", lambda dest: store)
    assert scrubbed.ok and {o.state for o in scrubbed.verified[0].objects} == {"ok"}
    assert RECORD not in [o.path for o in scrubbed.verified[0].objects]

    (art / MODEL).unlink()
    restored = restore_artifact(art, lambda dest: store, progress=False)
    assert restored.downloaded == [MODEL] and (art / MODEL).read_bytes() == (source / MODEL).read_bytes()

    again = publish_artifact(art, store, upload_prefix("old"), progress=False)
    assert again.status == "skipped"
    receipt_record.path_in(art).unlink()  # a rerun without the receipt: the remote declaration decides the form
    again = publish_artifact(art, store, upload_prefix("old"), progress=False)
    assert again.status == "adopted"
    assert old_form.read(declaration_record.FILENAME) == plain.declaration_bytes
    assert not part_digests_record.path_in(art).exists() and store.head(old_form.key(RECORD)) is None


@pytest.mark.parametrize("form", ["s3-multipart", "file"])
def test_an_archive_with_part_digests_is_accepted_by_a_v1_only_reader(damaged, form):
    arch = damaged(form, None)
    data = arch.read(declaration_record.FILENAME)
    declaration = json.loads(data)
    jsonschema.Draft202012Validator(json.loads(V1_DECLARATION_SCHEMA.read_text())).validate(declaration)
    # v1's inventory rules: every declared file is downloaded and holds its declared size and sha256; the
    # record is one more small file that checks.
    listed = {f["path"]: f for f in declaration["files"]}
    assert RECORD in listed and set(PAYLOADS) <= set(listed)
    for path, entry in listed.items():
        got = arch.read(path)
        assert (len(got), sha256_bytes(got)) == (entry["size"], entry["sha256"]), path
    assert declaration_record.parse_declaration(data).files == tuple(
        FileEntry(f["path"], f["size"], f["sha256"]) for f in declaration["files"])


# --- refusals --------------------------------------------------------------------------------------------


@pytest.fixture(params=["seaweedfs", "file"])
def small(request, tmp_path) -> Archive:
    """A small artifact (one part per file) freshly published to SeaweedFS or ``file://``."""
    art = make_artifact(tmp_path / "runs" / "run1")
    if request.param == "file":
        store = open_store("file", "", Path(), tmp_path / "archive")
    else:
        store = request.getfixturevalue("sw_store")
    publish_artifact(art, store, upload_prefix("small"), progress=False)
    return Archive(request.param, store, art, artifact_prefix(upload_prefix("small"), art.name))


def put_over(arch: Archive, rel: str, data: bytes) -> None:
    """Replace an object with other bytes (of any size), its sha256 metadata those bytes' own."""
    if arch.s3:
        arch.store._client.put_object(Bucket=arch.store.bucket, Key=arch.key(rel), Body=data,
                                      Metadata={"sha256": sha256_bytes(data)})
    else:
        (arch.store.root / arch.key(rel)).write_bytes(data)


@pytest.mark.parametrize("field", ["size", "sha256"])
def test_a_record_that_disagrees_with_the_declaration_is_refused_at_read_naming_it(small, field, tmp_path):
    record = part_digests_record.parse_part_digests(small.read(RECORD))
    files = dict(record.files)
    p = files[MODEL]
    files[MODEL] = (PartDigests(p.size - 1, p.sha256, p.part_size, p.digests) if field == "size"
                    else PartDigests(p.size, "0" * 64, p.part_size, p.digests))
    forged = part_digests_record.encode_part_digests(part_digests_record.PartDigestRecord(tuple(files.items())))
    declaration = declaration_record.parse_declaration(small.read(declaration_record.FILENAME))
    entries = tuple(FileEntry(RECORD, len(forged), sha256_bytes(forged)) if e.path == RECORD else e
                    for e in declaration.files)
    # The forged record is the declared bytes of a declaration that lists it; only its entry for model.pt lies.
    put_over(small, RECORD, forged)
    put_over(small, declaration_record.FILENAME, declaration_record.encode_declaration(
        declaration_record.Declaration(declaration.manifest_sha256, declaration.iteration, entries)))
    with pytest.raises(InvalidRecord, match=rf"{RECORD}.*model\.pt") as err:
        fetch_artifact(small.uri, tmp_path / "stage", store=small.store, progress=False)
    assert str(small.store.destination.uri(small.key(RECORD))) in str(err.value)
    assert not (tmp_path / "stage" / small.artifact.name / MODEL).exists()
    with pytest.raises(InvalidRecord, match=RECORD):
        load_part_digests(small.store, small.prefix, entries)


def test_a_record_that_disagrees_with_the_declaration_is_never_written_at_publish(tmp_path, sw_store, monkeypatch):
    art = make_artifact(tmp_path / "runs" / "run1")
    real = publish_inventory._part_digests

    def lying(artifact_dir, digests, pruned):
        record = real(artifact_dir, digests, pruned)
        files = dict(record.files)
        p = files[MODEL]
        files[MODEL] = PartDigests(p.size, "0" * 64, p.part_size, p.digests)
        return part_digests_record.PartDigestRecord(tuple(files.items()))

    monkeypatch.setattr(publish_inventory, "_part_digests", lying)
    with pytest.raises(InvalidRecord, match=rf"{RECORD} describes model\.pt"):
        publish_artifact(art, sw_store, upload_prefix("lying"), progress=False)
    assert list(sw_store.list("")) == [] and not part_digests_record.path_in(art).exists()
    assert not receipt_record.path_in(art).exists()


def test_check_bound_refuses_a_file_the_declaration_does_not_list_or_describes_otherwise(tmp_path):
    inv = build_local_inventory(make_artifact(tmp_path / "run1"), progress=False, write=False)
    record = part_digests_record.parse_part_digests(inv.part_digests_bytes)
    record.check_bound(inv.files, RECORD)  # the record the pass made is bound
    assert sorted(path for path, _ in record.files) == sorted(
        e.path for e in inv.files if e.path not in (RECORD, manifest_record.FILENAME))
    p = record.by_path()[MODEL]
    for other in (PartDigests(p.size + 1, p.sha256, p.part_size, p.digests),
                  PartDigests(p.size, "f" * 64, p.part_size, p.digests)):
        lying = part_digests_record.PartDigestRecord(tuple({**record.by_path(), MODEL: other}.items()))
        with pytest.raises(InvalidRecord, match=rf"{RECORD} describes model\.pt"):
            lying.check_bound(inv.files, RECORD)
    extra = part_digests_record.PartDigestRecord((*record.files, ("optim.pt", p)))
    with pytest.raises(InvalidRecord, match=r"optim\.pt, which the declaration does not list"):
        extra.check_bound(inv.files, RECORD)


def tamper(arch: Archive, how: str, tmp_path: Path | None = None) -> None:
    """Damage the archive's part digests record: ``missing`` (deleted), ``tampered`` (one hex digit changed,
    same size, on S3 the same sha256 metadata: HEAD still passes), ``truncated`` (its first half), ``foreign``
    (another artifact's record, published at another prefix of the same store)."""
    if how == "missing":
        if arch.s3:
            arch.store._client.delete_object(Bucket=arch.store.bucket, Key=arch.key(RECORD))
        else:
            (arch.store.root / arch.key(RECORD)).unlink()
        return
    data = arch.read(RECORD)
    if how == "truncated":
        put_over(arch, RECORD, data[:len(data) // 2])
        return
    if how == "foreign":
        other = make_artifact(tmp_path / "other" / "run1", seed=7)
        publish_artifact(other, arch.store, upload_prefix("other"), progress=False)
        foreign = (other / RECORD).read_bytes()
        assert foreign != data
        put_over(arch, RECORD, foreign)
        return
    at = re.search(rb'"parts": \[\s*"', data).end()  # a hex digit of the first part digest
    other = data[:at] + (b"0" if data[at:at + 1] != b"0" else b"1") + data[at + 1:]
    if arch.s3:  # same size and the same sha256 metadata: HEAD still passes
        arch.store._client.put_object(Bucket=arch.store.bucket, Key=arch.key(RECORD), Body=other,
                                      Metadata={"sha256": arch.store.head(arch.key(RECORD)).sha256})
    else:
        (arch.store.root / arch.key(RECORD)).write_bytes(other)


HOWS = [("tampered", "mismatch"), ("missing", "missing"), ("truncated", "mismatch"), ("foreign", "mismatch")]


@pytest.mark.parametrize(("how", "state"), HOWS)
def test_without_a_usable_record_fetch_and_restore_check_the_whole_file_sha256_and_verify_reports_it(
        small, how, state, tmp_path, caplog):
    """Every payload intact, the record deleted, truncated, tampered with or replaced by another artifact's:
    fetch and restore read the archive with one warning naming the record, every file checked by the
    whole-file SHA-256 the declaration binds (a flipped payload byte is still caught); verify --read-data
    reports the record in its own row and proves every payload."""
    tamper(small, how, tmp_path)
    where = str(small.store.destination.uri(small.key(RECORD)))
    original = {p: (small.artifact / p).read_bytes() for p in PAYLOADS}

    caplog.set_level("WARNING", logger="ckptflow")
    fetched = fetch_artifact(small.uri, tmp_path / "stage", store=small.store, progress=False)
    assert fetched.status == "fetched" and fetched.plan.part_digests == {}
    assert {p: (fetched.path / p).read_bytes() for p in PAYLOADS} == original
    warned = [r.getMessage() for r in caplog.records if where in r.getMessage()]
    assert len(warned) == 1 and "whole-file SHA-256" in warned[0] and "repair-part-digests" in warned[0], warned

    art = link_copy(small.artifact, tmp_path / "elsewhere")
    (art / MODEL).unlink()
    restored = restore_artifact(art, lambda dest: small.store, progress=False)
    assert restored.status == "restored" and restored.downloaded == [MODEL]
    assert (art / MODEL).read_bytes() == original[MODEL]
    if not small.s3:  # the CLI says it once, on stderr, and the run succeeds
        proc = run_cli("fetch", "--artifact-uri", small.uri, "--dst", str(tmp_path / "cli-stage"))
        assert proc.returncode == 0 and proc.report["status"] == "fetched", proc.stderr[-2000:]
        assert [line for line in proc.stderr.splitlines() if RECORD in line and "whole-file SHA-256" in line] != []
        assert proc.stderr.count(RECORD) == 1, proc.stderr

    result = verify_artifact(small.artifact, lambda dest: small.store, read_data=True)
    rows = {o.path: o for o in result.objects}
    assert not result.ok and [o.path for o in result.objects].count(RECORD) == 1
    assert rows[RECORD].state == state and RECORD in rows[RECORD].detail
    # Every other object is verified by its whole-file SHA-256.
    assert {p: o.state for p, o in rows.items() if p != RECORD} == {p: "ok" for p in rows if p != RECORD}
    assert all(rows[p].bytes_read == (small.artifact / p).stat().st_size for p in PAYLOADS)

    # Without the record a damaged payload is still caught, by its whole-file SHA-256.
    small.flip(MODEL, 1234)
    with pytest.raises(VerificationFailed, match=r"model\.pt"):
        fetch_artifact(small.uri, tmp_path / "stage2", store=small.store, progress=False)
    assert not (tmp_path / "stage2" / small.artifact.name / MODEL).exists()


@pytest.mark.parametrize(("how", "state"), HOWS)
def test_repair_part_digests_puts_the_record_back_from_the_local_copy(small, how, state, tmp_path, request):
    """``ckptflow repair-part-digests``: a dry run says what it would put back and writes nothing; the run puts
    the local copy back (it is the declared bytes), verify --read-data passes again and a fetch reads by the
    parts again, with no warning; a second run finds it intact."""
    creds = ["--credentials", str(request.getfixturevalue("seaweedfs_credentials_path"))] if small.s3 else []
    tamper(small, how, tmp_path)
    before = None if how == "missing" else small.read(RECORD)
    args = ["--artifact-dir", str(small.artifact), *creds]

    plan = run_cli("repair-part-digests", *args, "--dry-run")
    assert plan.returncode == 0, plan.stderr[-2000:]
    jsonschema_validate(plan.report)
    assert plan.report["status"] == "dry-run"
    assert [(d["state"], d["repaired"]) for d in plan.report["destinations"]] == [
        ("missing" if how == "missing" else "damaged", False)]
    assert (None if how == "missing" else small.read(RECORD)) == before  # nothing written

    proc = run_cli("repair-part-digests", *args)
    assert proc.returncode == 0, proc.stderr[-2000:]
    jsonschema_validate(proc.report)
    assert proc.report["status"] == "repaired" and proc.report["destinations"][0]["repaired"]
    assert small.read(RECORD) == (small.artifact / RECORD).read_bytes()
    assert verify_artifact(small.artifact, lambda dest: small.store, read_data=True).ok

    fetched = fetch_artifact(small.uri, tmp_path / "stage", store=small.store, progress=False)
    assert set(fetched.plan.part_digests) == set(PAYLOADS)  # checked part by part again

    again = run_cli("repair-part-digests", *args)
    assert again.returncode == 0 and again.report["status"] == "intact", again.stderr[-2000:]


def test_repair_part_digests_refuses_a_local_copy_that_is_not_the_declared_record(small, tmp_path):
    """A local copy that differs from the declared bytes (or none at all) is refused by name before anything
    is written: the damaged object stays as it was."""
    if small.s3:
        pytest.skip("the refusal is local; file:// shows it")
    tamper(small, "truncated")
    damaged_bytes = small.read(RECORD)
    local = small.artifact / RECORD
    local.write_bytes(local.read_bytes() + b" ")
    proc = run_cli("repair-part-digests", "--artifact-dir", str(small.artifact))
    assert proc.returncode == 1 and str(local) in proc.stderr and "nothing was written" in proc.stderr, proc.stderr
    assert small.read(RECORD) == damaged_bytes
    local.unlink()
    proc = run_cli("repair-part-digests", "--artifact-dir", str(small.artifact))
    assert proc.returncode == 1 and f"{local} does not exist" in proc.stderr, proc.stderr
    assert small.read(RECORD) == damaged_bytes


def jsonschema_validate(report) -> None:
    from ckptflow.jsonio import validate

    validate(report, "report_repair_part_digests", what="repair-part-digests report")


# --- cores, and resuming ---------------------------------------------------------------------------------


def test_hash_threads_honours_the_setting_and_never_exceeds_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    for setting, expected in [(None, 2), ("1", 1), ("2", 2), ("64", 2), ("0", 1), ("many", 2)]:
        if setting is None:
            monkeypatch.delenv("CKPTFLOW_HASH_THREADS", raising=False)
        else:
            monkeypatch.setenv("CKPTFLOW_HASH_THREADS", setting)
        assert hash_threads() == expected, setting
    monkeypatch.undo()
    monkeypatch.setenv("CKPTFLOW_HASH_THREADS", "4096")
    assert hash_threads() == len(os.sched_getaffinity(0))


def test_a_fetch_with_one_hash_thread_works_and_hashes_one_part_at_a_time(damaged, tmp_path, source, monkeypatch):
    arch = damaged("s3-multipart", None)
    monkeypatch.setenv("CKPTFLOW_HASH_THREADS", "1")
    lock, running, most = threading.Lock(), [0], [0]
    real = digest_mod.blake3_digest

    def counted(view):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            return real(view)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(digest_mod, "blake3_digest", counted)
    result = fetch_artifact(arch.uri, tmp_path / "stage", store=arch.store, progress=False)
    assert result.status == "fetched" and staging_record.read_staging(result.path).complete
    for rel in PAYLOADS:
        assert (result.path / rel).read_bytes() == (source / rel).read_bytes(), rel
    assert most[0] == 1


def test_a_resumed_part_file_continues_after_its_whole_parts_that_check(source, tmp_path):
    data = (source / MODEL).read_bytes()
    record = part_digests_record.parse_part_digests(
        build_local_inventory(source, progress=False, write=False).part_digests_bytes)
    parts = record.by_path()[MODEL]
    assert parts.part_size == part_digest_size(MODEL_BYTES) == 8 * MiB and len(parts.digests) == 3
    part = tmp_path / "model.pt.part"
    part.write_bytes(data[:12 * MiB])  # a fetch killed inside part 2
    assert verified_prefix(part, 12 * MiB, parts) == 8 * MiB
    part.write_bytes(data[:17 * MiB])  # inside part 3: two whole parts check
    assert verified_prefix(part, 17 * MiB, parts) == 16 * MiB
    damaged_first = bytearray(data[:17 * MiB])
    damaged_first[100] ^= 0x01  # a damaged byte in part 1: nothing after it is trusted either
    part.write_bytes(bytes(damaged_first))
    assert verified_prefix(part, 17 * MiB, parts) == 0


class StopsAt(CountingStore):
    """A real store whose reads of ``suffix`` from ``offset`` on fail (a connection the retries could not
    mend), each once every range before ``offset`` was read whole: a fetch stopped mid-file, its part
    holding exactly the bytes before ``offset``."""

    def __init__(self, inner, suffix: str, offset: int):
        super().__init__(inner)
        self.suffix, self.offset, self.read_before = suffix, offset, 0
        self.cond = threading.Condition()

    def open_range(self, key, offset, length):
        if not key.endswith(self.suffix):
            return super().open_range(key, offset, length)
        if offset >= self.offset:
            with self.cond:
                assert self.cond.wait_for(lambda: self.read_before == self.offset, timeout=60)
            raise StoreError(f"{key}: the connection was reset", remedy="rerun")
        return self._counted(super().open_range(key, offset, length), length)

    @contextmanager
    def _counted(self, opened, length: int):
        with opened as reader:
            yield reader
        with self.cond:
            self.read_before += length
            self.cond.notify_all()


@pytest.mark.parametrize("form", ["s3-multipart", "file"])
@pytest.mark.parametrize("part_file", ["intact", "damaged-in-part-1"])
def test_a_stopped_fetch_resumes_after_the_whole_parts_of_its_part_file_that_check(damaged, form, part_file,
                                                                                   tmp_path, source,
                                                                                   seaweedfs_credentials_path):
    arch = damaged(form, None)
    if arch.s3:  # ranges of one part each (S3's default range is larger than this file)
        arch = Archive(form, S3Store(arch.store.bucket, load_credentials(seaweedfs_credentials_path),
                                     download_range_size=8 * MiB), arch.artifact, arch.prefix)
    stopped = StopsAt(arch.store, "/" + MODEL, 16 * MiB)
    with pytest.raises(StoreError, match="reset"):
        fetch_artifact(arch.uri, tmp_path / "stage", store=stopped, progress=False)
    staged = tmp_path / "stage" / source.name
    [left] = [staged / p for p in no_parts(staged)]
    assert left.name.startswith(f".{MODEL}.") and not (staged / MODEL).exists()
    if part_file != "intact":  # a byte of part 1 changed on disk since: nothing of the part is trusted
        with open(left, "r+b") as fh:
            fh.seek(100)
            byte = fh.read(1)
            fh.seek(100)
            fh.write(bytes([byte[0] ^ 0x01]))

    counting = CountingStore(arch.store)
    result = fetch_artifact(arch.uri, tmp_path / "stage", store=counting, progress=False)
    assert result.status == "resumed" and staging_record.read_staging(staged).complete
    assert (staged / MODEL).read_bytes() == (source / MODEL).read_bytes() and no_parts(staged) == []
    resumed = {r["path"]: r["offset"] for r in result.resumed}
    model = [(start, end) for key, start, end in counting.downloads if key.endswith("/" + MODEL)]
    if part_file == "intact":
        assert resumed[MODEL] == 16 * MiB and counting.spans("/" + MODEL) == [(16 * MiB, MODEL_BYTES)]
    else:  # from 0, and downloaded once, not resumed and then downloaded whole again
        assert resumed.get(MODEL, 0) == 0 and counting.spans("/" + MODEL) == [(0, MODEL_BYTES)]
    assert sum(end - start for start, end in model) == MODEL_BYTES - resumed.get(MODEL, 0)
    assert counting.whole_calls == []


def test_a_pruned_artifact_whose_own_record_is_gone_republishes_with_the_archives_record(small):
    """Payloads pruned, then the record beside the manifest deleted: the parts of the pruned payloads are
    known only to the archive's record, which publish takes (bound by the remote declaration), so a rerun
    is the same publication (skipped), never a refusal, and the record is back beside the manifest."""
    art = small.artifact
    record = art / part_digests_record.FILENAME
    kept = record.read_bytes()
    (art / "optim.pt").unlink()  # the sample's stale file, which prune would keep the artifact for
    report = prune_verified([art], lambda dest: small.store)
    assert report.removed and not (art / "model.pt").exists()
    record.unlink()
    result = publish_artifact(art, small.store, upload_prefix("small"), progress=False)
    assert result.status == "skipped"
    assert record.read_bytes() == kept
