"""kill -9 at any point of a merge leaves the old committed output or a state the same command rebuilds."""

from __future__ import annotations

import signal
import socket
import subprocess

import pytest
from merge_helpers import assert_bits_equal, avg_oracle, load_net, tv_oracle

from ckptflow.digest import sha256_file
from ckptflow.records import merge_record
from helpers.cli import run_cli

POINTS = [
    "merge:mid-model-write",
    "merge:after-model-write",
    "merge:after-record-removed",
    "merge:after-model-rename",
    "merge:after-manifest",
]


def _merge(args, kill_at=None):
    env = {"CKPTFLOW_TEST_KILL_AT": kill_at} if kill_at else {}
    return run_cli("merge", *args, env=env)


def _avg_args(moe, out, experts=None):
    return ["--mode", "avg", "--experts", ",".join(map(str, experts or moe.paths())), "--out", str(out)]


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.slow
def test_killed_first_merge_is_completed_by_the_same_command(moe, out, point):
    killed = _merge(_avg_args(moe, out), kill_at=point)
    assert killed.returncode == -signal.SIGKILL
    assert not (out.parent / merge_record.FILENAME).exists()  # never "done" after a kill
    rerun = _merge(_avg_args(moe, out))
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.report["status"] == "built"
    assert_bits_equal(load_net(out), avg_oracle(moe.mem))
    leftovers = [p.name for p in out.parent.iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []
    if point in ("merge:mid-model-write", "merge:after-model-write"):
        assert rerun.report["removed_temporaries"]
    assert _merge(_avg_args(moe, out)).report["status"] == "skipped"


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_killed_forced_replacement_leaves_the_old_merge_or_a_rebuildable_one(moe, out, point):
    assert _merge(_avg_args(moe, out)).returncode == 0
    old_record = merge_record.read_merge_record(out.parent)
    tv = ["--mode", "tv", "--base", str(moe.base), "--experts", ",".join(map(str, moe.paths())), "--out", str(out)]
    assert _merge([*tv, "--force"], kill_at=point).returncode == -signal.SIGKILL
    record_path = out.parent / merge_record.FILENAME
    if record_path.exists():  # the old committed merge, intact
        assert merge_record.read_merge_record(out.parent) == old_record
        assert sha256_file(out).sha256 == next(o.sha256 for o in old_record.outputs if o.path == "model.pt")
        assert _merge(tv).report["status"] == "refused"  # still needs --force
        rerun = _merge([*tv, "--force"])
    else:  # uncommitted: the plain command rebuilds
        rerun = _merge(tv)
    assert rerun.returncode == 0, rerun.stderr
    assert_bits_equal(load_net(out), tv_oracle(moe.base_mem, moe.mem, 1.0))


@pytest.mark.slow
def test_a_rerun_removes_only_dead_temporaries_of_this_host(moe, out):
    """A temporary whose writer is alive, or was written on another host (whose writer may be alive), stays."""
    host = socket.gethostname().split(".")[0]
    out.parent.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    with subprocess.Popen(["sleep", "60"]) as live:
        names = {
            "dead": f".model.pt.{host}.{gone.pid}.0123abcd.tmp",
            "live": f".model.pt.{host}.{live.pid}.0123abcd.tmp",
            "elsewhere": f".model.pt.otherhost.{gone.pid}.0123abcd.tmp",
            "user": ".model.pt.backup",
        }
        for kind, name in names.items():
            (out.parent / name).write_bytes(f"{kind} bytes".encode())
        result = _merge(_avg_args(moe, out))
        live.kill()
    assert result.returncode == 0 and result.report["status"] == "built", result.stderr
    assert result.report["removed_temporaries"] == [names["dead"]]
    assert not (out.parent / names["dead"]).exists()
    for kind in ("live", "elsewhere", "user"):
        assert (out.parent / names[kind]).read_bytes() == f"{kind} bytes".encode(), kind
