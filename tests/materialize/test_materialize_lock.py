"""One materializer per output (``<out>.lock``) and the source bound once (model.pt opened once, under it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket

import pytest
from materialize_helpers import DEFAULTS, cli_args, cli_env, copy_tree, lock_file, siblings

from ckptflow.conversion import verify_output
from ckptflow.digest import sha256_file
from ckptflow.errors import Refused, UsageError
from ckptflow.materialize import materialize
from ckptflow.materialize.lock import output_lock
from ckptflow.records import manifest as manifest_record
from ckptflow.records import materialized as marker
from helpers.cli import finish, run_cli, start_cli, wait_for_file
from helpers.trees import tree_bytes


def build(models, out, *, seed: int = 1, ckpt_dir=None, **kw):
    return materialize(ckpt_dir=ckpt_dir or models.artifact("qwen3", seed), base=models.base(), out=out,
                       **{**DEFAULTS, **kw})




def own_artifact(models, tmp_path, *, digest: bool = True):
    """A private copy of the seed-1 artifact (tests replace its model.pt); ``digest=False``: its manifest
    records no digest for model.pt, so the identity is hashed from the file."""
    art = copy_tree(models.artifact("qwen3", 1), tmp_path / "run" / "checkpoint_artifacts" / "iter_000300")
    if not digest:
        manifest = manifest_record.read_manifest(art)
        model = manifest.components["model"]
        manifest_record.path_in(art).unlink()
        manifest_record.write_manifest(art, manifest_record.Manifest(
            manifest.iteration, {"model": manifest_record.FileComponent(model.path, model.size)}))
    return art


def replace_model(art, models, seed: int) -> None:
    """Put another model.pt (same size, other bytes) at the path by rename, as a re-save does."""
    tmp = art / "model.pt.new"
    shutil.copyfile(models.artifact("qwen3", seed) / "model.pt", tmp)
    os.replace(tmp, art / "model.pt")


# --------------------------------------------------------------------------------------------- the lock


@pytest.mark.parametrize("wait", [-1, float("inf"), float("nan"), "5"])
def test_lock_wait_seconds_must_be_a_finite_number(models, tmp_path, wait):
    out = tmp_path / "teacher"
    with pytest.raises(UsageError, match="--lock-wait-seconds"):
        build(models, out, lock_wait_seconds=wait)
    assert not out.exists() and not lock_file(out).exists()


def test_a_held_lock_is_refused_after_the_bound_naming_its_holder_and_nothing_is_touched(models, tmp_path):
    out = tmp_path / "teacher"
    build(models, out)
    before, beside = tree_bytes(out), siblings(out)
    with output_lock(out, 0):
        holder = json.loads(lock_file(out).read_text())
        assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname() and holder["started"]
        proc = run_cli(*cli_args(models.artifact("qwen3", 2), models.base(), out, "--force",
                                 "--lock-wait-seconds", "0.5"))
    assert proc.returncode == 1 and proc.report["status"] == "refused", proc.stderr
    assert f"pid {os.getpid()} on host {socket.gethostname()}" in proc.stderr and "--lock-wait-seconds" in proc.stderr
    assert tree_bytes(out) == before and siblings(out) == beside
    assert build(models, out).status == "skipped"  # released: the next request decides as usual


@pytest.mark.slow
def test_simultaneous_requests_wait_then_one_builds_one_skips_and_a_differing_one_is_refused(models, tmp_path):
    out = tmp_path / "teacher"
    flags = {name: tmp_path / f"paused-{name}" for name in ("first", "same", "other")}
    first = start_cli(*cli_args(models.artifact("qwen3", 1), models.base(), out),
                      env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:after-open",
                                  CKPTFLOW_TEST_PAUSE_FILE=str(flags["first"])))
    procs = {"first": first}
    try:
        wait_for_file(flags["first"], first)  # it holds the lock
        for name, seed in (("same", 1), ("other", 2)):
            procs[name] = start_cli(*cli_args(models.artifact("qwen3", seed), models.base(), out),
                                    env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:lock-wait",
                                                CKPTFLOW_TEST_PAUSE_FILE=str(flags[name])))
            wait_for_file(flags[name], procs[name])  # it found the lock held and waits
            flags[name].unlink()
        flags["first"].unlink()
        outputs = {name: finish(proc) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert procs["first"].returncode == 0 and '"status": "built"' in outputs["first"][0], outputs["first"][1]
    assert procs["same"].returncode == 0 and '"status": "skipped"' in outputs["same"][0], outputs["same"][1]
    assert procs["other"].returncode == 1 and "holds the completed build" in outputs["other"][1]
    assert marker.read_materialized(out).source.sha256 == sha256_file(models.artifact("qwen3", 1) / "model.pt").sha256
    assert siblings(out) == []


def test_a_users_file_named_like_the_lock_is_refused_by_name_and_survives(models, tmp_path):
    out = tmp_path / "teacher"
    user = lock_file(out)
    user.write_bytes(b"my notes about the teacher run\n")
    proc = run_cli(*cli_args(models.artifact(), models.base(), out))
    assert proc.returncode == 1 and proc.report["status"] == "refused", proc.stderr
    assert str(user) in proc.stderr and "not a ckptflow lock" in proc.stderr
    assert user.read_bytes() == b"my notes about the teacher run\n"
    assert not out.exists() and siblings(out) == []


def test_an_empty_file_named_like_the_lock_is_used_but_never_written_or_removed(models, tmp_path):
    out = tmp_path / "teacher"
    lock_file(out).touch()
    before = os.stat(lock_file(out))
    assert build(models, out).status == "built"
    after = os.stat(lock_file(out))
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, 0, before.st_mtime_ns)


@pytest.mark.slow
def test_a_built_or_refused_request_leaves_no_lock_file(models, tmp_path):
    out = tmp_path / "teacher"
    first = run_cli(*cli_args(models.artifact("qwen3", 1), models.base(), out))
    assert first.returncode == 0 and first.report["status"] == "built", first.stderr
    assert not lock_file(out).exists()
    before = tree_bytes(out)
    refused = run_cli(*cli_args(models.artifact("qwen3", 2), models.base(), out))  # another source, no --force
    assert refused.returncode == 1 and refused.report["status"] == "refused", refused.stderr
    assert not lock_file(out).exists() and siblings(out) == [] and tree_bytes(out) == before


@pytest.mark.slow
def test_the_lock_of_a_killed_holder_is_replaced_and_then_removed(models, tmp_path):
    out = tmp_path / "teacher"
    killed = run_cli(*cli_args(models.artifact(), models.base(), out),
                     env=cli_env(CKPTFLOW_TEST_KILL_AT="materialize:after-open"))
    assert killed.returncode == -signal.SIGKILL
    stale = json.loads(lock_file(out).read_text())  # the killed holder's record stays behind
    assert stale["host"] == socket.gethostname() and stale["pid"] != os.getpid()
    proc = run_cli(*cli_args(models.artifact(), models.base(), out, "--lock-wait-seconds", "0"))
    assert proc.returncode == 0 and proc.report["status"] == "built", proc.stderr
    assert not lock_file(out).exists()


def test_a_lock_is_removed_only_while_it_is_still_ours(models, tmp_path):
    """A lock file replaced while held (another inode, another record) is left to whoever made it."""
    out = tmp_path / "teacher"
    with output_lock(out, 0) as path:
        os.unlink(path)
        path.write_text(json.dumps({"pid": 1, "host": "elsewhere", "started": "2026-01-01T00:00:00Z"}) + "\n")
    assert json.loads(path.read_text())["host"] == "elsewhere"


# --------------------------------------------------------------------------------------------- the source bound once


@pytest.mark.slow
@pytest.mark.parametrize("point", ["after-open", "after-convert"])
def test_model_pt_replaced_during_the_build_is_not_what_is_converted_or_verified(models, tmp_path, point):
    reference = build(models, tmp_path / "reference").record  # what seed 1 converts to
    art = own_artifact(models, tmp_path)
    out = tmp_path / "teacher"
    flag = tmp_path / "paused"
    proc = start_cli(*cli_args(art, models.base(), out),
                     env=cli_env(CKPTFLOW_TEST_PAUSE_AT=f"materialize:{point}", CKPTFLOW_TEST_PAUSE_FILE=str(flag)))
    wait_for_file(flag, proc)
    replace_model(art, models, seed=2)
    flag.unlink()
    stdout, stderr = finish(proc)
    assert proc.returncode == 0 and '"status": "built"' in stdout, stderr
    assert json.loads(stdout)["verification"]["tensors_verified"] is True
    record = marker.read_materialized(out)
    assert record.source == reference.source  # the bytes consumed: the file opened, not the path's new one
    assert [(e.path, e.sha256) for e in record.shards] == [(e.path, e.sha256) for e in reference.shards]


@pytest.mark.slow
@pytest.mark.parametrize("digest", [False, True])
def test_model_pt_replaced_while_waiting_for_the_lock_is_read_once_under_it(models, tmp_path, digest):
    art = own_artifact(models, tmp_path, digest=digest)
    out = tmp_path / "teacher"
    flag = tmp_path / "paused"
    with output_lock(out, 0):
        proc = start_cli(*cli_args(art, models.base(), out),
                         env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:lock-wait", CKPTFLOW_TEST_PAUSE_FILE=str(flag)))
        wait_for_file(flag, proc)
        replace_model(art, models, seed=2)  # while it waits: the manifest was read, model.pt not yet opened
        flag.unlink()
    stdout, stderr = finish(proc)
    if digest:  # the manifest binds seed 1's digest: the file opened under the lock is refused against it
        assert proc.returncode == 1 and "its manifest records" in stderr, stderr
        assert not out.exists() and siblings(out) == []
        return
    assert proc.returncode == 0 and '"status": "built"' in stdout, stderr
    consumed = models.artifact("qwen3", 2) / "model.pt"
    assert marker.read_materialized(out).source.sha256 == sha256_file(consumed).sha256  # the marker names them
    verify_output(out, models.base(), consumed, min_tensors=DEFAULTS["min_tensors"])


@pytest.mark.slow
def test_an_in_place_change_of_the_opened_model_pt_refuses_the_build(models, tmp_path):
    art = own_artifact(models, tmp_path)
    out = tmp_path / "teacher"
    build(models, out, ckpt_dir=art)
    before = tree_bytes(out)
    flag = tmp_path / "paused"
    proc = start_cli(*cli_args(art, models.base(), out, "--force"),
                     env=cli_env(CKPTFLOW_TEST_PAUSE_AT="materialize:after-convert", CKPTFLOW_TEST_PAUSE_FILE=str(flag)))
    wait_for_file(flag, proc)
    path = art / "model.pt"
    st = path.stat()
    with open(path, "r+b") as fh:  # the same inode rewritten in place (here with the same byte)
        first = fh.read(1)
        fh.seek(0)
        fh.write(first)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    flag.unlink()
    _stdout, stderr = finish(proc)
    assert proc.returncode == 1 and "changed in place" in stderr, stderr
    assert tree_bytes(out) == before and siblings(out) == []


def test_refusing_a_held_lock_does_not_open_model_pt(models, tmp_path, monkeypatch):
    out = tmp_path / "teacher"

    def no_open(*args, **kwargs):
        raise AssertionError("model.pt is opened only under the lock")

    monkeypatch.setattr("ckptflow.materialize.source.OpenedModel.open", no_open)
    with output_lock(out, 0), pytest.raises(Refused, match="still held"):
        build(models, out, lock_wait_seconds=0)
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("copies", ["one", "current-copy-gone"])
def test_a_request_waiting_while_prune_removes_model_pt_builds_from_the_archive_its_receipt_names(models, tmp_path,
                                                                                                 copies):
    """A holds the lock; B waits; prune-verified removes the published model.pt meanwhile. B resolves its
    source again under the lock: the archive the receipt names holds the same model, so B skips A's build
    (no download: the decision comes first) instead of failing with "model.pt is missing". With a second copy
    added (``--add-destination``, the receipt's current destination) whose root is gone, the first copy serves."""
    art = own_artifact(models, tmp_path)
    archive = tmp_path / "archive"
    archive.mkdir()
    env = cli_env(CKPTFLOW_CACHE_DIR=str(tmp_path / "cache"))
    published = run_cli("publish", "--artifact-dir", str(art), "--upload-prefix", "proj/g/run/ts/checkpoints",
                        "--bucket", f"file://{archive}", env=env)
    assert published.returncode == 0, published.stderr
    prune_args = []
    if copies == "current-copy-gone":
        other = tmp_path / "other-archive"
        other.mkdir()
        added = run_cli("publish", "--artifact-dir", str(art), "--upload-prefix", "proj/g/run/ts/checkpoints",
                        "--bucket", f"file://{other}", "--add-destination", env=env)
        assert added.returncode == 0, added.stderr
        other.rename(tmp_path / "other-archive.unmounted")
        prune_args = ["--destination", f"file://{archive}"]
    out = tmp_path / "teacher"
    flags = {name: tmp_path / f"paused-{name}" for name in ("first", "waiting")}
    procs = {"first": start_cli(*cli_args(art, models.base(), out),
                                env={**env, "CKPTFLOW_TEST_PAUSE_AT": "materialize:after-open",
                                     "CKPTFLOW_TEST_PAUSE_FILE": str(flags["first"])})}
    try:
        wait_for_file(flags["first"], procs["first"])  # it holds the lock, model.pt opened
        procs["waiting"] = start_cli(*cli_args(art, models.base(), out),
                                     env={**env, "CKPTFLOW_TEST_PAUSE_AT": "materialize:lock-wait",
                                          "CKPTFLOW_TEST_PAUSE_FILE": str(flags["waiting"])})
        wait_for_file(flags["waiting"], procs["waiting"])  # its source was resolved with model.pt present
        flags["waiting"].unlink()
        pruned = run_cli("prune-verified", "--paths", str(art), *prune_args, env=env)
        assert pruned.returncode == 0 and not (art / "model.pt").exists(), pruned.stdout + pruned.stderr
        flags["first"].unlink()
        outputs = {name: finish(proc) for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert procs["first"].returncode == 0 and json.loads(outputs["first"][0])["status"] == "built", outputs["first"][1]
    assert procs["waiting"].returncode == 0, outputs["waiting"][1]
    report = json.loads(outputs["waiting"][0])
    assert report["status"] == "skipped" and report["source"]["kind"] == "artifact-uri", report
    assert report["source"]["location"] == f"file://{archive}/proj/g/run/ts/checkpoint_artifacts/iter_000300"
    assert report["fetch"] is None  # skipped before any download
    assert siblings(out) == []


@pytest.mark.slow
def test_materialize_ckpt_dir_of_a_pruned_artifact_is_served_by_the_copy_that_is_whole(models, tmp_path):
    """Copies on A and B (``--add-destination``: B current), pruned on A's proof, B's model.pt then damaged:
    ``materialize --ckpt-dir`` reads the archive its receipt names, B first (its manifest is fine, the fetch of
    model.pt fails), then A, with one warning naming B; the report names A and B. The private stage is removed."""
    art = own_artifact(models, tmp_path)
    roots = {name: tmp_path / name for name in ("A", "B")}
    env = cli_env(CKPTFLOW_CACHE_DIR=str(tmp_path / "cache"))
    for n, root in enumerate(roots.values()):
        root.mkdir()
        published = run_cli("publish", "--artifact-dir", str(art), "--upload-prefix", "proj/g/run/ts/checkpoints",
                            "--bucket", f"file://{root}", *(["--add-destination"] if n else []), env=env)
        assert published.returncode == 0, published.stderr
    pruned = run_cli("prune-verified", "--paths", str(art), "--destination", f"file://{roots['A']}", env=env)
    assert pruned.returncode == 0 and not (art / "model.pt").exists(), pruned.stdout + pruned.stderr
    obj = roots["B"] / "proj/g/run/ts/checkpoint_artifacts/iter_000300/model.pt"
    data = bytearray(obj.read_bytes())
    data[len(data) // 2] ^= 0x01
    obj.write_bytes(bytes(data))
    out = tmp_path / "teacher"
    proc = run_cli(*cli_args(art, models.base(), out), env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.report
    a_uri, b_uri = (f"file://{roots[n]}/proj/g/run/ts/checkpoint_artifacts/iter_000300" for n in ("A", "B"))
    assert report["status"] == "built" and report["source"]["kind"] == "artifact-uri"
    assert report["source"]["location"] == a_uri and report["fetch"]["downloaded"] == ["model.pt"]
    [skipped] = report["skipped_destinations"]
    assert skipped["source_uri"] == b_uri and "model.pt" in skipped["detail"]
    warned = [line for line in proc.stderr.splitlines() if "cannot serve" in line]
    assert len(warned) == 1 and str(roots["B"]) in warned[0], proc.stderr[-3000:]
    assert marker.read_materialized(out).source.uri == a_uri
    assert siblings(out) == []  # the private stage went with the request
