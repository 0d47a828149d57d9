"""Every name an artifact may hold is restorable: long names come back, unrestorable ones are refused early."""

from __future__ import annotations

import hashlib
import signal
import unicodedata

import pytest

from ckptflow.archive.fetch import fetch_artifact
from ckptflow.archive.publish import publish_artifact
from ckptflow.artifact import ComponentSpec, seal_artifact
from ckptflow.errors import Refused
from ckptflow.fsutil import walk_files
from ckptflow.records import declaration as declaration_record
from ckptflow.records import manifest as manifest_record
from ckptflow.records import staging as staging_record
from ckptflow.records.inventory import FileEntry
from ckptflow.store.local import LocalStore
from helpers.artifacts import ARTIFACT_PREFIX, UPLOAD_PREFIX
from helpers.cli import run_cli

MiB = 1024 * 1024
LONG = "s" * 241 + ".distcp"  # 247 characters: fits NAME_MAX, but not inside `.<name>.<host>.<pid>.<token>.part`


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _artifact(root, shard_bytes: int = 70_000):
    art = root / "checkpoint_artifacts" / "iter_000300"
    (art / "optim").mkdir(parents=True)
    (art / "model.pt").write_bytes(b"m" * 5000)
    (art / "optim" / ".metadata").write_bytes(b"meta")
    with open(art / "optim" / LONG, "wb") as fh:
        for left in range(shard_bytes, 0, -MiB):
            fh.write(bytes([left % 251]) * min(left, MiB))
    seal_artifact(art, 300, [ComponentSpec("model", "model.pt"), ComponentSpec("optim", "optim")], progress=False)
    return art


def _same_tree(art, staged):
    for rel in ["model.pt", "optim/.metadata", f"optim/{LONG}", manifest_record.FILENAME]:
        assert (staged / rel).read_bytes() == (art / rel).read_bytes(), rel


def test_a_247_character_shard_name_is_published_and_fetched_back(tmp_path):
    art = _artifact(tmp_path / "run")
    (tmp_path / "archive").mkdir()
    publish_artifact(art, LocalStore(tmp_path / "archive"), UPLOAD_PREFIX, progress=False)
    result = run_cli("fetch", "--artifact-uri", f"file://{tmp_path / 'archive'}/{ARTIFACT_PREFIX}",
                     "--dst", str(tmp_path / "stage"))
    assert result.returncode == 0, result.stderr
    staged = tmp_path / "stage" / "iter_000300"
    _same_tree(art, staged)
    assert not [p for p in walk_files(staged) if p.endswith(".part")]


@pytest.mark.slow
def test_a_fetch_killed_inside_a_long_named_file_resumes_from_its_short_named_part(
        tmp_path, sw_store, seaweedfs_credentials_path):
    art = _artifact(tmp_path / "run", shard_bytes=40 * MiB)
    publish_artifact(art, sw_store, UPLOAD_PREFIX, progress=False)
    args = ("fetch", "--artifact-uri", f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", "--dst", str(tmp_path / "stage"),
            "--credentials", str(seaweedfs_credentials_path))
    killed = run_cli(*args, env={"CKPTFLOW_TEST_KILL_AT": f"fetch:mid-file:optim/{LONG}"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    staged = tmp_path / "stage" / "iter_000300"
    from ckptflow.fsutil import temp_stem  # parts of long names are named after a short stem

    [part] = [p for p in walk_files(staged) if p.startswith(f"optim/.{temp_stem(LONG)}.") and p.endswith(".part")]
    assert len(part.split("/")[-1]) < 100
    rerun = fetch_artifact(f"s3://{sw_store.bucket}/{ARTIFACT_PREFIX}", tmp_path / "stage", store=sw_store,
                           progress=False)
    assert f"optim/{LONG}" in {r["path"] for r in rerun.resumed if r["offset"] > 0}
    assert rerun.left_beside == []
    _same_tree(art, staged)
    assert not [p for p in walk_files(staged) if p.endswith(".part")]


NFC = unicodedata.normalize("NFC", "caf\u00e9.pt")
NFD = unicodedata.normalize("NFD", NFC)


@pytest.mark.parametrize("names", [("Model.pt", "model.pt"), (NFC, NFD)], ids=["case", "nfc"])
def test_seal_refuses_names_that_collide_under_case_folding_or_nfc(tmp_path, names):
    art = tmp_path / "checkpoint_artifacts" / "iter_000300"
    art.mkdir(parents=True)
    for i, name in enumerate(names):
        (art / name).write_bytes(bytes([i]) * 10)
    specs = [ComponentSpec(f"c{i}", name) for i, name in enumerate(names)]
    with pytest.raises(Refused, match="one name on case-insensitive") as err:
        seal_artifact(art, 300, specs, progress=False)
    assert all(repr(n) in str(err.value) for n in names)
    assert not manifest_record.path_in(art).exists()


def _foreign_manifest(art, files: dict[str, bytes]) -> bytes:
    """A manifest another tool committed, one file component per entry."""
    art.mkdir(parents=True, exist_ok=True)
    components = {f"c{i}": {"format": "file", "path": p, "size": len(b), "sha256": _sha(b)}
                  for i, (p, b) in enumerate(sorted(files.items()))}
    manifest = manifest_record.Manifest.from_dict({"schema": manifest_record.SCHEMA, "iteration": 300,
                                                    "components": components, "producer": {"tool": "trainer", "version": "1"}})
    manifest_record.write_manifest(art, manifest)
    return manifest_record.path_in(art).read_bytes()


def test_publish_refuses_manifests_naming_what_fetch_could_not_restore(tmp_path, sw_store):
    too_long = tmp_path / "long" / "checkpoint_artifacts" / "iter_000300"
    _foreign_manifest(too_long, {"w" * 300 + ".pt": b"x"})  # a name this file system cannot even hold
    with pytest.raises(Refused, match=r"303 bytes .* limit of 255 bytes"):
        publish_artifact(too_long, sw_store, UPLOAD_PREFIX, progress=False)
    folded = tmp_path / "case" / "checkpoint_artifacts" / "iter_000300"
    _foreign_manifest(folded, {"Model.pt": b"a", "model.pt": b"b"})
    for name, data in (("Model.pt", b"a"), ("model.pt", b"b")):
        (folded / name).write_bytes(data)
    with pytest.raises(Refused, match=r"'Model\.pt' and 'model\.pt'"):
        publish_artifact(folded, sw_store, UPLOAD_PREFIX, progress=False)
    assert sw_store.list("") == []


def _hand_made_archive(store, tmp_path, files: dict[str, bytes]) -> str:
    """An archive an older publisher wrote: declaration, payloads and manifest under ARTIFACT_PREFIX."""
    manifest_bytes = _foreign_manifest(tmp_path / "src" / "iter_000300", files)
    entries = [FileEntry(p, len(b), _sha(b)) for p, b in files.items()]
    entries.append(FileEntry(manifest_record.FILENAME, len(manifest_bytes), _sha(manifest_bytes)))
    decl = declaration_record.encode_declaration(
        declaration_record.Declaration(manifest_sha256=_sha(manifest_bytes), iteration=300, files=tuple(entries)))
    # SeaweedFS refuses keys with a component over 255 bytes: such payloads stay out (fetch refuses first).
    payloads = [(p, b) for p, b in files.items() if len(p.encode()) <= 255]
    for name, data in [(declaration_record.FILENAME, decl), *payloads, (manifest_record.FILENAME, manifest_bytes)]:
        assert store.put_bytes_create_once(f"{ARTIFACT_PREFIX}/{name}", data, sha256=_sha(data))
    return f"s3://{store.bucket}/{ARTIFACT_PREFIX}"


@pytest.mark.parametrize("files, message", [
    ({"Model.pt": b"a", "model.pt": b"b"}, "'Model.pt' and 'model.pt' are one name"),
    ({NFC: b"a", NFD: b"b"}, "are one name on case-insensitive or Unicode-normalising"),
    ({"w" * 300 + ".pt": b"x"}, r"303 bytes .* limit of 255 bytes"),
], ids=["case", "nfc", "too-long"])
def test_fetch_refuses_an_archive_it_could_not_restore_naming_the_paths_and_writes_nothing(
        tmp_path, sw_store, files, message):
    uri = _hand_made_archive(sw_store, tmp_path, files)
    with pytest.raises(Refused, match=message):
        fetch_artifact(uri, tmp_path / "stage", store=sw_store, progress=False)
    assert not (tmp_path / "stage").exists()
    assert not staging_record.path_in(tmp_path / "stage" / "iter_000300").exists()
