"""``make demo``, the main job, runs end to end: the demo script as a subprocess, on its own SeaweedFS
(demo ports, data under ``.ckptflow/demo``, which it starts from nothing), through the Snakemake workflow
to a teacher that loads and generates; the server it started is stopped."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers import REPO, servers


@pytest.mark.slow
def test_the_demo_runs_through_the_workflow_and_stops_its_server():
    proc = subprocess.run(["bash", str(REPO / "demo" / "demo.sh")], capture_output=True, text=True, timeout=900,
                          cwd=REPO)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    for step in ("merge_experts", "publish_all", "verify_all", "prune_all", "materialize_teacher", "status"):
        assert step in out, step
    assert "greedy:" in out and "(archive)" in out  # the teacher was built from the archive, then generated
    status = json.loads((REPO / ".ckptflow" / "demo" / "reports" / "status.json").read_text())
    assert status["counts"]["materialized"] == 1 and status["counts"]["pruned"] == 5, status["counts"]
    state = servers.read_state(REPO / ".ckptflow" / "demo" / "server")
    assert not any(servers.is_running(s) for s in state.get("servers", {}).values())
