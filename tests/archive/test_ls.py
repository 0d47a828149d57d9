"""``ckptflow ls``: what an archive holds under a prefix, read from its listing and declarations alone.

Every artifact here is written by the real ``ckptflow publish`` (one killed before its manifest), on a real
SeaweedFS bucket and on a ``file://`` archive; foreign objects sit beside them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ckptflow.digest import sha256_bytes
from ckptflow.jsonio import validate
from ckptflow.records import read_manifest
from ckptflow.records.manifest import path_in as manifest_path
from ckptflow.store.credentials import load_credentials
from ckptflow.store.local import LocalStore
from ckptflow.store.s3 import S3Store
from helpers.artifacts import make_artifact
from helpers.cli import run_cli, run_on_terminal

TS = "20261129T000000Z"
RUN1, RUN2, RUN3 = (f"proj/group/{r}/{TS}" for r in ("run1", "run2", "run3"))


@pytest.fixture(params=[pytest.param("seaweedfs", marks=pytest.mark.seaweedfs), "file"])
def archive(request, tmp_path):
    """(store, the URI of its root, the options that reach it)."""
    if request.param == "seaweedfs":
        bucket = request.getfixturevalue("seaweedfs_bucket")
        creds = request.getfixturevalue("seaweedfs_credentials_path")
        return S3Store(bucket, load_credentials(creds)), f"s3://{bucket}", ["--credentials", str(creds)]
    (tmp_path / "archive").mkdir()
    return LocalStore(tmp_path / "archive"), f"file://{tmp_path / 'archive'}", []


def publish(art: Path, root_uri: str, opts: list[str], *extra: str, env: dict | None = None):
    return run_cli("publish", "--artifact-dir", str(art), "--bucket", root_uri, *opts, *extra, env=env)


def put(store, key: str, data: bytes) -> None:
    assert store.put_bytes_create_once(key, data, sha256=sha256_bytes(data))


def declared(art: Path) -> tuple[int, int]:
    """(files, bytes) ls reports for an artifact: its payload files, the manifest's, as seal, publish and
    status count them (records.sizes); the manifest and the part digests record are objects, not its size."""
    files = read_manifest(art).physical_files()
    return len(files), sum(f.size for f in files)


@pytest.fixture
def populated(archive, tmp_path):
    """runs/RUN1: 100 published (local), 200 published with --delete-local (pruned), 300 killed before its
    manifest (incomplete); elsewhere/RUN2: 400 published (absent from runs/); beside them a full checkpoint,
    a foreign file, objects under RUN3's checkpoint_artifacts/iter_000001 without records, and a declaration
    that is not JSON under RUN3's iter_000002."""
    store, root_uri, opts = archive
    runs = tmp_path / "runs"
    arts = {it: make_artifact(runs / RUN1, iteration=it, seed=it) for it in (100, 200, 300)}
    arts[400] = make_artifact(tmp_path / "elsewhere" / RUN2, iteration=400, seed=4)
    assert publish(arts[100], root_uri, opts).returncode == 0
    assert publish(arts[200], root_uri, opts, "--delete-local").returncode == 0
    killed = publish(arts[300], root_uri, opts, env={"CKPTFLOW_TEST_KILL_AT": "publish:before-manifest"})
    assert killed.returncode == -9
    assert publish(arts[400], root_uri, opts).returncode == 0
    sizes = {it: declared(a) for it, a in arts.items()}
    put(store, f"{RUN1}/checkpoints/iter_000100/rank0.pt", b"full checkpoint")
    put(store, "proj/foreign/data.csv", b"a,b\n1,2\n")
    put(store, f"{RUN3}/checkpoint_artifacts/iter_000001/weights.bin", b"w" * 100)
    put(store, f"{RUN3}/checkpoint_artifacts/iter_000002/.posttrain-archive.json", b"not json")
    return {"runs": runs, "sizes": sizes, "root_uri": root_uri, "opts": opts}


def rows(report: dict) -> dict[tuple[str, int], dict]:
    return {(a["run"], a["iteration"]): a for a in report["artifacts"]}


@pytest.mark.slow
def test_ls_shows_committed_incomplete_and_foreign_prefixes_by_what_their_records_prove(populated):
    proc = run_cli("ls", f"{populated['root_uri']}/proj", "--runs-root", str(populated["runs"]), *populated["opts"])
    assert proc.returncode == 0, proc.stderr
    report = proc.report
    validate(report, "report_ls", what="ls report")
    got = rows(report)
    assert list(got) == [(RUN1, 100), (RUN1, 200), (RUN1, 300), (RUN2, 400), (RUN3, 1), (RUN3, 2)]
    assert {k: (a["state"], a["local"]["state"]) for k, a in got.items()} == {
        (RUN1, 100): ("committed", "local"), (RUN1, 200): ("committed", "pruned"),
        (RUN1, 300): ("incomplete", "local"), (RUN2, 400): ("committed", "absent"),
        (RUN3, 1): ("not-an-artifact", "absent"), (RUN3, 2): ("corrupt", "absent")}
    for it in (100, 200, 300, 400):
        a = got[(RUN2 if it == 400 else RUN1, it)]
        assert (a["files"], a["bytes"]) == populated["sizes"][it]
        assert a["declared_at"] is not None
        assert (a["published_at"] is None) == (it == 300)
        assert a["uri"].endswith(f"/proj/group/{'run2' if it == 400 else 'run1'}/{TS}/checkpoint_artifacts/iter_{it:06d}")
    assert "publication was interrupted" in got[(RUN1, 300)]["detail"]
    assert "not published by ckptflow" in got[(RUN3, 1)]["detail"]
    assert got[(RUN3, 1)]["files"] is None and got[(RUN3, 1)]["objects"] == 1
    assert ".posttrain-archive.json" in got[(RUN3, 2)]["detail"]
    assert report["other"]["objects"] == 2
    assert [k.rpartition("proj/")[2] for k in report["other"]["sample"]] == [
        "foreign/data.csv", f"group/run1/{TS}/checkpoints/iter_000100/rank0.pt"]
    assert report["counts"] == {"artifacts": 6, "runs": 3, "committed": 3, "damaged": 0, "incomplete": 1, "legacy": 0,
                                "corrupt": 1, "not-an-artifact": 1, "other_objects": 2}
    assert report["bytes"] == sum(n for _, n in populated["sizes"].values())


@pytest.mark.slow
def test_ls_of_one_run_lists_only_that_run(populated):
    proc = run_cli("ls", f"{populated['root_uri']}/proj/group/run1", *populated["opts"])
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_ls", what="ls report")
    assert list(rows(proc.report)) == [(RUN1, 100), (RUN1, 200), (RUN1, 300)]
    assert "local" not in proc.report["artifacts"][0] and proc.report["runs_root"] is None
    assert proc.report["other"]["objects"] == 1  # the full checkpoint beside the artifacts


@pytest.mark.slow
def test_ls_on_a_terminal_is_a_table_that_fits_80_columns(populated):
    proc = run_on_terminal("ls", f"{populated['root_uri']}/proj", "--runs-root", str(populated["runs"]),
                           *populated["opts"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("6 artifacts in 3 runs under ")
    table = lines[1:lines.index("details:")]
    assert all(len(line) <= 80 for line in table if not line.startswith("1 other") and "other objects" not in line), table
    assert any(line.split()[:2] == ["iter_000200", "committed"] and line.endswith("pruned") for line in table), table
    assert any(line.split()[:2] == ["iter_000300", "incomplete"] for line in table), table


def test_ls_of_an_artifact_directory_on_file_lists_it_alone(tmp_path):
    archive = tmp_path / "archive"
    archive.mkdir()
    art = make_artifact(tmp_path / "runs" / RUN1, iteration=7)
    assert publish(art, f"file://{archive}", []).returncode == 0
    inside = archive / RUN1 / "checkpoint_artifacts" / "iter_000007"
    proc = run_cli("ls", f"file://{inside}")
    assert proc.returncode == 0, proc.stderr
    assert [(a["run"], a["name"], a["state"]) for a in proc.report["artifacts"]] == [(RUN1, "iter_000007", "committed")]
    assert proc.report["artifacts"][0]["uri"] == f"file://{inside}"
    below = run_cli("ls", f"file://{inside}/optim")
    assert below.returncode == 2 and "lies inside the artifact" in below.stderr


def test_ls_of_a_missing_archive_root_is_refused_by_name(tmp_path):
    proc = run_cli("ls", f"file://{tmp_path / 'nowhere'}")
    assert proc.returncode == 1
    assert str(tmp_path / "nowhere") in proc.stderr
    bad = run_cli("ls", "ftp://host/x")
    assert bad.returncode == 2 and "ftp" in bad.stderr


@pytest.mark.seaweedfs
def test_ls_of_a_wrong_bucket_names_the_uri_form_ls_takes_not_a_bucket_flag(seaweedfs_credentials_path, tmp_path):
    creds = str(seaweedfs_credentials_path)
    proc = run_cli("ls", "s3://ckptflow-no-such-bucket/proj", "--credentials", creds)
    assert proc.returncode == 1 and "bucket 'ckptflow-no-such-bucket' does not exist" in proc.stderr, proc.stderr
    assert "ckptflow ls s3://BUCKET/PREFIX" in proc.stderr and "--bucket" not in proc.stderr, proc.stderr
    root = run_cli("ls", f"file://{tmp_path / 'nowhere'}")
    assert root.returncode == 1 and "ckptflow ls file:///DIR" in root.stderr, root.stderr
    # A bucket or a directory written without its scheme: the form, and the URI it most likely meant.
    bare = run_cli("ls", "ckptflow-no-such-bucket/proj", "--credentials", creds)
    assert bare.returncode == 2 and "s3://BUCKET/PREFIX" in bare.stderr, bare.stderr
    assert "did you mean `ckptflow ls s3://ckptflow-no-such-bucket/proj`?" in bare.stderr, bare.stderr
    path = run_cli("ls", str(tmp_path))
    assert path.returncode == 2 and f"did you mean `ckptflow ls file://{tmp_path}`?" in path.stderr, path.stderr


@pytest.mark.slow
def test_ls_shows_a_declared_file_deleted_or_resized_on_the_store_as_damaged(archive, tmp_path):
    store, root_uri, opts = archive
    arts = {it: make_artifact(tmp_path / "runs" / RUN1, iteration=it, seed=it) for it in (10, 20)}
    for art in arts.values():
        assert publish(art, root_uri, opts).returncode == 0
    where = f"{RUN1}/checkpoint_artifacts"
    store.delete(f"{where}/iter_000010/model.pt")
    store.delete(f"{where}/iter_000020/optim/__1_0.distcp")
    put(store, f"{where}/iter_000020/optim/__1_0.distcp", b"shorter than declared")
    proc = run_cli("ls", f"{root_uri}/proj", *opts)
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_ls", what="ls report")
    got = rows(proc.report)
    assert {k: a["state"] for k, a in got.items()} == {(RUN1, 10): "damaged", (RUN1, 20): "damaged"}
    assert "model.pt missing" in got[(RUN1, 10)]["detail"]
    assert "optim/__1_0.distcp has 21 bytes, declared 50001" in got[(RUN1, 20)]["detail"]
    for it, art in arts.items():
        assert (got[(RUN1, it)]["files"], got[(RUN1, it)]["bytes"]) == declared(art)
        assert got[(RUN1, it)]["published_at"] is not None
    assert proc.report["counts"]["damaged"] == 2 and proc.report["counts"]["committed"] == 0


def test_ls_counts_a_legacy_archive_from_its_manifest(archive, tmp_path):
    """A manifest and its payloads without a declaration, as the retired publisher left them."""
    store, root_uri, opts = archive
    art = make_artifact(tmp_path / "runs" / RUN1, iteration=50, seed=5)
    where = f"{RUN1}/checkpoint_artifacts/iter_000050"
    for f in read_manifest(art).physical_files():
        put(store, f"{where}/{f.path}", (art / f.path).read_bytes())
    put(store, f"{where}/{manifest_path(art).name}", manifest_path(art).read_bytes())
    proc = run_cli("ls", f"{root_uri}/proj", *opts)
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_ls", what="ls report")
    (row,) = proc.report["artifacts"]
    assert (row["state"], row["files"], row["bytes"]) == ("legacy", *declared(art))
    assert row["declared_at"] is None and row["published_at"] is not None
    assert "older publisher" in row["detail"]
    assert proc.report["counts"]["legacy"] == 1


def _drop(store, prefix: str) -> None:
    for info in store.list(prefix):
        store.delete(info.key)


@pytest.mark.slow
def test_ls_never_shows_a_local_copy_bound_to_another_archive_as_local(archive, tmp_path):
    """runs/ holds RUN1 iter 100 (published to another archive), iter 200 (published there and pruned),
    iter 300 (published here) and iter 400 (published here, then the archive's copy was replaced by another
    copy's publication); the listed archive holds another copy of 100 and 200."""
    store, root_uri, opts = archive
    other_root = tmp_path / "other-archive"
    other_root.mkdir()
    runs, spare = tmp_path / "runs" / RUN1, tmp_path / "spare" / RUN1
    mine = {it: make_artifact(runs, iteration=it, seed=it) for it in (100, 200, 300, 400)}
    theirs = {it: make_artifact(spare, iteration=it, seed=it + 1) for it in (100, 200, 400)}
    assert publish(mine[100], f"file://{other_root}", []).returncode == 0
    assert publish(mine[200], f"file://{other_root}", [], "--delete-local").returncode == 0
    assert publish(mine[300], root_uri, opts).returncode == 0
    assert publish(mine[400], root_uri, opts).returncode == 0
    _drop(store, f"{RUN1}/checkpoint_artifacts/iter_000400/")
    for it in (100, 200, 400):
        assert publish(theirs[it], root_uri, opts).returncode == 0
    proc = run_cli("ls", f"{root_uri}/proj", "--runs-root", str(tmp_path / "runs"), *opts)
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_ls", what="ls report")
    got = rows(proc.report)
    assert {it: (a["state"], a["local"]["state"]) for (_, it), a in got.items()} == {
        100: ("committed", "elsewhere"), 200: ("committed", "elsewhere"), 300: ("committed", "local"),
        400: ("committed", "differs")}
    for it in (100, 200):
        assert f"file://{other_root}/{RUN1}/checkpoint_artifacts/iter_{it:06d}" in got[(RUN1, it)]["local"]["detail"]
    assert "published again from another copy" in got[(RUN1, 400)]["local"]["detail"]
    assert "detail" not in got[(RUN1, 300)]["local"]
    listed_there = run_cli("ls", f"file://{other_root}/proj", "--runs-root", str(tmp_path / "runs"))
    assert {it: a["local"]["state"] for (_, it), a in rows(listed_there.report).items()} == {
        100: "local", 200: "pruned"}


@pytest.mark.slow
def test_ls_shows_local_only_for_a_copy_whose_manifest_the_archive_declares(archive, tmp_path):
    """The archive holds RUN1 iter 100, 200 and 300 published from spare/; runs/ holds other bytes for 100
    (no receipt) and 200 (the published copy's receipt copied beside it: status calls it foreign), and a
    byte-identical copy of 300 made before its publication (no receipt)."""
    _, root_uri, opts = archive
    runs, spare = tmp_path / "runs" / RUN1, tmp_path / "spare" / RUN1
    theirs = {it: make_artifact(spare, iteration=it, seed=it) for it in (100, 200, 300)}
    mine = {it: make_artifact(runs, iteration=it, seed=it + 1) for it in (100, 200)}
    mine[300] = runs / "checkpoint_artifacts" / theirs[300].name
    shutil.copytree(theirs[300], mine[300])
    for it in (100, 200, 300):
        assert publish(theirs[it], root_uri, opts).returncode == 0
    shutil.copy2(theirs[200] / ".uploaded", mine[200] / ".uploaded")
    status = run_cli("status", str(tmp_path / "runs"), "--json")
    assert {r["iteration"]: r["published"]["state"] for r in status.report["rows"]} == {
        100: "none", 200: "foreign", 300: "none"}
    proc = run_cli("ls", f"{root_uri}/proj", "--runs-root", str(tmp_path / "runs"), *opts)
    assert proc.returncode == 0, proc.stderr
    validate(proc.report, "report_ls", what="ls report")
    got = {it: a["local"] for (_, it), a in rows(proc.report).items()}
    assert {it: cell["state"] for it, cell in got.items()} == {100: "differs", 200: "foreign", 300: "local"}
    local_digest = sha256_bytes(manifest_path(mine[100]).read_bytes())
    assert local_digest in got[100]["detail"] and str(mine[100]) in got[100]["detail"]
    assert str(mine[200] / ".uploaded") in got[200]["detail"] or str(mine[200]) in got[200]["detail"]
    assert "detail" not in got[300]


@pytest.mark.slow
def test_seal_publish_status_and_ls_give_one_artifact_the_same_bytes(archive, tmp_path):
    """One definition of an artifact's size (``records.sizes``: its payload files' bytes), in every report
    and every summary: seal's, publish's, status's local and archived, and ls's row and headline."""
    from ckptflow.units import human_bytes
    from helpers.artifacts import write_payloads

    _, root_uri, opts = archive
    runs = tmp_path / "runs"
    art = write_payloads(runs / RUN1 / "checkpoint_artifacts" / "iter_000100", seed=100)
    sealed = run_on_terminal("seal", "--artifact-dir", str(art), "--iteration", "100", "model=model.pt", "optim=optim")
    assert sealed.returncode == 0, sealed.stderr
    size = sum(f.size for f in read_manifest(art).physical_files())
    published = publish(art, root_uri, opts)
    assert published.returncode == 0, published.stderr
    assert sum(e["size"] for e in published.report["inventory"] if not e["path"].startswith(".posttrain")) == size
    status = run_cli("status", str(runs), *opts).report
    listed = run_cli("ls", f"{root_uri}/proj", *opts).report
    assert status["local_bytes"] == status["archived_bytes"] == status["rows"][0]["archived_bytes"] == size
    assert listed["bytes"] == listed["artifacts"][0]["bytes"] == size
    assert listed["artifacts"][0]["object_bytes"] > size  # the records are objects of the archive, not its size
    shown = human_bytes(size)
    assert f", {shown}" in sealed.stdout, sealed.stdout
    summaries = [run_on_terminal("status", str(runs), *opts, columns=120),
                 run_on_terminal("ls", f"{root_uri}/proj", *opts, columns=120)]
    for proc in summaries:
        assert proc.returncode == 0, proc.stderr
    status_text, ls_text = (p.stdout for p in summaries)
    assert f"local {shown}" in status_text and f"archived {shown}" in status_text, status_text
    row = next(line for line in ls_text.splitlines() if "iter_000100" in line)
    assert shown in row and f"payload files, {shown} as" in ls_text, ls_text
