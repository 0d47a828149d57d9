"""A ``file://`` archive that is the runs tree itself under another mount path (a bind mount of the runs
root) overlaps the artifact as surely as the same path does: publish compares devices and inodes, not
only resolved paths, and refuses before writing anything. Real ``python -m ckptflow`` processes in a
private mount namespace (``unshare -m``), so the bind mount vanishes with them."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys

import pytest

from helpers import REPO
from helpers.artifacts import make_artifact
from helpers.trees import tree_state

RUN = "proj/grp/run1/20261201T000000Z"


def _in_a_mount_namespace(tmp_path, bind_source, mountpoint, *argv: str) -> subprocess.CompletedProcess:
    """``argv`` of ckptflow run where ``mountpoint`` is a bind mount of ``bind_source``, seen by it alone."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    mountpoint.mkdir(parents=True, exist_ok=True)
    command = (f"mount --bind {shlex.quote(str(bind_source))} {shlex.quote(str(mountpoint))} || exit 97; "
               f"exec {shlex.quote(sys.executable)} -m ckptflow {shlex.join(argv)}")
    env = {**os.environ, "CKPTFLOW_PROGRESS": "0", "CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", command], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode == 97 or "unshare failed" in proc.stderr:
        pytest.skip(f"no private mount namespace with a bind mount here: {proc.stderr.strip()}")
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("delete_local", [False, True])
def test_a_file_archive_that_is_the_runs_tree_under_another_mount_path_is_refused_before_any_write(
        tmp_path, delete_local):
    runs = tmp_path / "runs"
    art = make_artifact(runs / RUN)
    before = tree_state(runs)
    alias = tmp_path / "mnt" / "archive"  # the runs root again, by a bind mount: another path, the same inodes
    extra = ["--delete-local"] if delete_local else []
    for dry in ([], ["--dry-run"]):
        proc = _in_a_mount_namespace(tmp_path, runs, alias, "publish", "--artifact-dir", str(art),
                                     "--bucket", f"file://{alias}", *extra, *dry)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert "overlaps the artifact" in line and str(alias) in line and "same device and inode" in line, line
        assert json.loads(proc.stdout)["status"] == "refused"
        # Nothing written: no declaration, no .ckptflow-meta, no probe scratch beside the payloads.
        assert tree_state(runs) == before


@pytest.mark.slow
def test_a_file_archive_inside_the_artifact_under_another_mount_path_is_refused(tmp_path):
    runs = tmp_path / "runs"
    art = make_artifact(runs / RUN)
    (art / "archive").mkdir()  # an archive root inside the artifact, reached through a mount of the runs root
    before = tree_state(runs)
    alias = tmp_path / "mnt" / "runs"
    proc = _in_a_mount_namespace(tmp_path, runs, alias, "publish", "--artifact-dir", str(art),
                                 "--bucket", f"file://{alias / RUN / 'checkpoint_artifacts' / art.name / 'archive'}")
    assert proc.returncode == 1 and "overlaps the artifact" in proc.stderr, proc.stdout + proc.stderr
    assert tree_state(runs) == before
