"""`seal`: hash named components, commit the native manifest last, refuse anything unsafe."""

import hashlib
import os

import pytest

from ckptflow.artifact import (
    ComponentSpec,
    committed_artifacts,
    find_runs,
    parse_component_spec,
    seal_artifact,
)
from ckptflow.errors import NotFound, Refused, UnsafePath, UsageError
from ckptflow.records import manifest as manifest_record


@pytest.fixture
def artifact(tmp_path):
    art = tmp_path / "run" / "checkpoint_artifacts" / "iter_000300"
    (art / "optim").mkdir(parents=True)
    (art / "model.pt").write_bytes(os.urandom(4096))
    for name in (".metadata", "__0_0.distcp", "__1_0.distcp"):
        (art / "optim" / name).write_bytes(os.urandom(1000))
    return art


def specs(*pairs):
    return [ComponentSpec(n, p) for n, p in pairs]


def test_seal_records_every_file_with_its_digest(artifact):
    rec = seal_artifact(artifact, 300, specs(("model", "model.pt"), ("optim", "optim")), progress=False)
    again = manifest_record.read_manifest(artifact)
    assert again == rec
    assert rec.iteration == 300
    files = {f.path: f for f in rec.physical_files()}
    assert sorted(files) == ["model.pt", "optim/.metadata", "optim/__0_0.distcp", "optim/__1_0.distcp"]
    for rel, entry in files.items():
        data = (artifact / rel).read_bytes()
        assert entry.size == len(data) and entry.sha256 == hashlib.sha256(data).hexdigest()


def test_seal_refuses_an_existing_manifest_and_leaves_it_byte_identical(artifact):
    seal_artifact(artifact, 300, specs(("model", "model.pt")), progress=False)
    before = manifest_record.path_in(artifact).read_bytes()
    with pytest.raises(Refused, match="already exists"):
        seal_artifact(artifact, 300, specs(("model", "model.pt"), ("optim", "optim")), progress=False)
    assert manifest_record.path_in(artifact).read_bytes() == before


def test_seal_refuses_iteration_that_does_not_match_directory(artifact):
    with pytest.raises(Refused, match="iter_000300"):
        seal_artifact(artifact, 301, specs(("model", "model.pt")), progress=False)
    assert not manifest_record.path_in(artifact).exists()


def test_seal_refuses_directory_not_named_iter(tmp_path):
    d = tmp_path / "checkpoint-300"
    d.mkdir()
    (d / "model.pt").write_bytes(b"x")
    with pytest.raises(UsageError, match="iter_"):
        seal_artifact(d, 300, specs(("model", "model.pt")), progress=False)


def test_seal_refuses_a_symlinked_component(artifact, tmp_path):
    (tmp_path / "elsewhere.pt").write_bytes(b"x")
    (artifact / "link.pt").symlink_to(tmp_path / "elsewhere.pt")
    with pytest.raises(UnsafePath, match="symlink"):
        seal_artifact(artifact, 300, specs(("model", "link.pt")), progress=False)
    assert not manifest_record.path_in(artifact).exists()


def test_seal_refuses_a_symlink_inside_a_dcp_component(artifact, tmp_path):
    (tmp_path / "shard").write_bytes(b"x")
    (artifact / "optim" / "__2_0.distcp").symlink_to(tmp_path / "shard")
    with pytest.raises(UnsafePath, match=r"__2_0\.distcp"):
        seal_artifact(artifact, 300, specs(("optim", "optim")), progress=False)


@pytest.mark.parametrize("path", ["../escape.pt", "/etc/passwd", "a/../../b"])
def test_seal_refuses_paths_escaping_the_directory(path):
    with pytest.raises(UnsafePath):
        parse_component_spec(f"model={path}")


def test_seal_of_missing_component_names_it(artifact):
    with pytest.raises(NotFound, match=r"trainer\.pt"):
        seal_artifact(artifact, 300, specs(("trainer", "trainer.pt")), progress=False)


def test_overlapping_components_are_refused(artifact):
    with pytest.raises(UsageError, match="both contain"):
        seal_artifact(artifact, 300, specs(("optim", "optim"), ("meta", "optim/.metadata")), progress=False)


@pytest.mark.parametrize("text", ["model", "=model.pt", "model=", "bad name=x"])
def test_malformed_component_specs_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_component_spec(text)


def _committed(run_dir, name, *, manifest=True):
    art = run_dir / "checkpoint_artifacts" / name
    art.mkdir(parents=True)
    if manifest:
        manifest_record.path_in(art).write_text("{}")


def test_committed_artifacts_are_those_with_a_manifest_in_runs_that_are_not_walked_into(tmp_path):
    runs = tmp_path / "runs"
    _committed(runs / "p/g/r/t1", "iter_000001")
    _committed(runs / "p/g/r/t1", "iter_000002", manifest=False)  # an interrupted save
    _committed(runs / "p/g/r/t1", "notes")
    _committed(runs / "p/g/r2/t", "iter_000001")
    # Inside a run (its full checkpoints) and under hidden directories nothing is looked for.
    _committed(runs / "p/g/r/t1/checkpoints/copy", "iter_000009")
    _committed(runs / ".trash/p/g/r/t0", "iter_000003")
    assert list(find_runs(runs)) == ["p/g/r/t1", "p/g/r2/t"]
    assert committed_artifacts(runs) == [("p/g/r/t1", "iter_000001"), ("p/g/r2/t", "iter_000001")]
    assert committed_artifacts(tmp_path / "absent") == []
