"""The trainer API called by every rank of a real ``torchrun --nproc-per-node 2`` job (gloo, CPU): collective
saves (rank 0 writes model.pt and seals once every rank's shards are durable; rank 0 alone publishes), the
resume guard decided on rank 0 and followed by every rank, resume across world sizes through DCP, one
rank failing or killed mid-save, and the requeued job that resumes and publishes what the killed one left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trainer_helpers import tiny_training

from ckptflow.trainer import write_artifact
from helpers import REPO, preloaded
from helpers.cli import run_cli

RUN = "proj/grp/run1/20261129T000000Z"
EXAMPLE = REPO / "examples" / "train_tiny.py"
WORKER = Path(__file__).with_name("rank_worker.py")
FULL = ("--components", "model,optimizer,trainer_state")
PLAIN_KEYS = ["0.bias", "0.weight", "2.bias", "2.weight"]  # the unwrapped model's names

pytestmark = pytest.mark.slow


def torchrun(script: Path, *args: str, env: dict | None = None, nproc: int = 2) -> subprocess.CompletedProcess:
    return preloaded.torchrun(["--standalone", "--nproc-per-node", str(nproc), str(script), *args], cwd=REPO,
                              timeout=300,
                              env={**os.environ, "CKPTFLOW_PROGRESS": "0", "OMP_NUM_THREADS": "1", **(env or {})})


def train(tmp: Path, *args: str, env: dict | None = None,
          bucket: str | None = None) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """The example under torchrun, publishing to ``bucket`` (with its ``--credentials`` in ``args``) or to
    the file:// archive ``tmp/store``."""
    store = tmp / "store"
    store.mkdir(exist_ok=True)
    run_dir = tmp / "runs" / RUN
    proc = torchrun(EXAMPLE, "--run-dir", str(run_dir), "--save-every", "2", *FULL, "--bucket",
                    bucket or f"file://{store}", *args, env=env)
    return proc, run_dir, store


def result_line(proc: subprocess.CompletedProcess) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout  # rank 0 alone prints it
    return json.loads(lines[0])


def rows(root: Path) -> dict[str, dict]:
    done = run_cli("status", str(root), "--json")
    return {r["name"]: r for r in done.report["rows"]}


def _run_param(name: str):
    """A run two tests read (the FSDP ones, also resumed from by the DCP test) is one xdist group: both tests
    go to one worker, one after the other, which builds the run once (a module fixture is built again on
    each worker that runs a test of it)."""
    return pytest.param(name, marks=pytest.mark.xdist_group(f"two-rank-{name}")) if name.startswith("fsdp") else name


@pytest.fixture(scope="module", params=[_run_param(p) for p in ("ddp", "fsdp", "ddp-async", "fsdp-async")])
def two_rank_run(request, tmp_path_factory):
    """The example's run of two ranks; ``-async``: with ``--async-save`` (every rank stages and writes its
    shards in the background, rank 0 seals over the saves' own gloo group)."""
    tmp = tmp_path_factory.mktemp(f"two-rank-{request.param}")
    parallel, _, mode = request.param.partition("-")
    proc, run_dir, store = train(tmp, "--parallel", parallel, "--steps", "4", *(["--async-save"] if mode else []))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return request.param, proc, run_dir, store


def test_every_rank_saves_collectively_rank0_writes_model_pt_seals_and_alone_publishes(two_rank_run):
    _, proc, run_dir, store = two_rank_run
    result = result_line(proc)
    assert result["saved"] == [2, 4] and result["failed"] == []
    assert result["published"] == ["iter_000002", "iter_000004"]
    assert proc.stdout.count("step 3 loss") == 1  # one rank prints
    for it in (2, 4):
        art = run_dir / "checkpoint_artifacts" / f"iter_{it:06d}"
        manifest = json.loads((art / ".posttrain-checkpoint-artifact.json").read_text())
        assert sorted(manifest["components"]) == ["model", "optim", "trainer"]
        shards = {f["path"] for f in manifest["components"]["optim"]["files"]}
        assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= shards  # every rank's DCP shards
        net = torch.load(art / "model.pt", weights_only=True)["net"]
        assert sorted(net) == PLAIN_KEYS and all(type(v) is torch.Tensor for v in net.values())  # full, unwrapped
        assert not (art / ".save-in-progress").exists() and (art / ".uploaded").is_file()
        assert (store / RUN / "checkpoint_artifacts" / art.name / ".posttrain-archive.json").is_file()
    assert {r["published"]["state"] for r in rows(run_dir).values()} == {"receipt"}


@pytest.mark.parametrize("two_rank_run", [_run_param("fsdp"), _run_param("fsdp-async")],
                         indirect=True)  # the FSDP runs' artifacts
def test_a_dcp_save_of_two_ranks_resumes_on_one_rank_and_on_two_bit_identically(two_rank_run, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    tmp, run_dir = tmp_path, two_rank_run[2]
    newest = run_dir / "checkpoint_artifacts" / "iter_000004"
    one = subprocess.run([sys.executable, str(WORKER), "resume", str(run_dir), str(tmp / "one.pt"), "none"],
                         capture_output=True, text=True, cwd=REPO, timeout=300)
    assert one.returncode == 0, one.stderr[-4000:]
    two = torchrun(WORKER, "resume", str(run_dir), str(tmp / "two.pt"), "fsdp")
    assert two.returncode == 0, two.stderr[-4000:]
    saved = torch.load(newest / "model.pt", weights_only=True)["net"]
    dcp_to_torch_save(newest / "optim", tmp / "reference.pt")  # the shards as written, read without resharding
    reference = torch.load(tmp / "reference.pt", weights_only=False)["optim"]["state"]
    for dump in ("one.pt", "two.pt"):
        got = torch.load(tmp / dump, weights_only=False)
        assert set(got["points"]) == {str(newest)}  # every rank resumed from the same artifact
        assert sorted(got["model"]) == PLAIN_KEYS
        assert all(torch.equal(got["model"][k], saved[k]) for k in saved)
        assert sorted(got["optim"]["state"]) == PLAIN_KEYS
        for name, moments in reference.items():
            for key, value in moments.items():
                assert torch.equal(got["optim"]["state"][name][key], value), (dump, name, key)


def test_every_rank_follows_the_guard_rank0_decided_refused_or_a_fresh_attempt_minted_once(tmp_path):
    run_dir = tmp_path / "runs" / RUN
    write_artifact(run_dir, 2, {"model": tiny_training()[0]})  # model-only: nothing resumable
    proc = torchrun(EXAMPLE, "--run-dir", str(run_dir), "--parallel", "ddp", "--steps", "4", *FULL)
    assert proc.returncode != 0
    assert proc.stderr.count(f"train_tiny: refusing to start in attempt directory {run_dir}") == 2  # both ranks
    assert "step 1" not in proc.stdout and sorted(p.name for p in (run_dir / "checkpoint_artifacts").iterdir()) == [
        "iter_000002"]
    # resume=off: rank 0 mints one fresh attempt beside it, and both ranks save there together.
    proc = torchrun(EXAMPLE, "--run-dir", str(run_dir), "--parallel", "ddp", "--steps", "2", *FULL, "--resume", "off")
    assert proc.returncode == 0, proc.stderr[-4000:]
    [minted] = [p for p in run_dir.parent.iterdir() if p != run_dir]
    assert result_line(proc)["run_dir"] == str(minted) and minted.name.startswith(f"{run_dir.name}-fresh-")
    manifest = json.loads((minted / "checkpoint_artifacts" / "iter_000002" / ".posttrain-checkpoint-artifact.json")
                          .read_text())
    assert {"__0_0.distcp", "__1_0.distcp"} <= {f["path"] for f in manifest["components"]["optim"]["files"]}


@pytest.mark.parametrize("mode", ["fail", "fail-async"])
def test_a_failure_on_one_rank_seals_nothing_and_every_rank_raises_the_same_named_error(tmp_path, mode):
    run_dir, store = tmp_path / "runs" / RUN, tmp_path / "store"
    store.mkdir()
    proc = torchrun(WORKER, mode, str(run_dir), str(tmp_path / "raised"), "ddp", f"file://{store}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    raised = [json.loads((tmp_path / f"raised.{rank}.json").read_text()) for rank in (0, 1)]
    expected = "RankFailed" if mode == "fail" else "BackgroundSaveFailed"  # at the wait, naming iteration 2
    assert raised[0] == raised[1] and raised[0]["type"] == expected
    assert mode == "fail" or "background save of iteration 2" in raised[0]["message"]
    assert "failed on 1 of 2 ranks (rank 1: OSError: input/output error" in raised[0]["message"]
    art = run_dir / "checkpoint_artifacts" / "iter_000002"
    assert not (art / ".posttrain-checkpoint-artifact.json").exists() and (art / ".save-in-progress").is_file()
    assert rows(tmp_path / "runs")["iter_000002"]["local"]["state"] == "incomplete"
    assert list(store.iterdir()) == []  # never published


def archived(bucket: str, credentials: Path) -> list[str]:
    done = run_cli("ls", f"s3://{bucket}/{RUN}", "--credentials", str(credentials))
    assert done.returncode == 0, done.stderr
    return sorted(a["name"] for a in done.report["artifacts"] if a["state"] == "committed")


def test_a_rank_killed_mid_save_is_not_committed_and_the_requeued_job_resumes_and_publishes_everything(
        tmp_path, seaweedfs_bucket, seaweedfs_credentials_path):
    flag = tmp_path / "publication-held"
    s3 = {"bucket": seaweedfs_bucket}
    creds = ("--credentials", str(seaweedfs_credentials_path))
    killed, run_dir, _ = train(tmp_path, "--parallel", "fsdp", "--steps", "6", *creds, **s3, env={
        "CKPTFLOW_TEST_KILL_AT": "trainer-save:rank1-durable-iter4",  # rank 1: shards written, before the seal
        "CKPTFLOW_TEST_PAUSE_AT": "trainer:before-publish", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    assert killed.returncode != 0 and "saved iter_000002" in killed.stdout
    assert "saved iter_000004" not in killed.stdout and "step 5" not in killed.stdout
    arts = run_dir / "checkpoint_artifacts"
    assert {"__0_0.distcp", "__1_0.distcp"} <= {p.name for p in (arts / "iter_000004" / "optim").iterdir()}
    assert not (arts / "iter_000004" / ".posttrain-checkpoint-artifact.json").exists()
    assert (arts / "iter_000002" / ".posttrain-checkpoint-artifact.json").is_file()
    assert not (arts / "iter_000002" / ".uploaded").exists()  # its publication was held, then killed
    before = rows(tmp_path / "runs")
    assert before["iter_000004"]["local"]["state"] == "incomplete"
    assert before["iter_000002"]["local"]["state"] == "committed" and before["iter_000002"]["published"]["state"] == "none"
    assert archived(seaweedfs_bucket, seaweedfs_credentials_path) == []  # no publication started for iter 4
    flag.unlink(missing_ok=True)

    requeued, _, _ = train(tmp_path, "--parallel", "fsdp", "--steps", "6", *creds, **s3)  # as Slurm requeues it
    assert requeued.returncode == 0, requeued.stderr[-4000:]
    assert requeued.stdout.splitlines()[0].startswith("step 3 ")  # resumed from iter 2, not from step 0
    result = result_line(requeued)
    assert result["saved"] == [4, 6] and result["failed"] == []
    assert sorted(result["published"]) == ["iter_000002", "iter_000004", "iter_000006"]
    after = rows(tmp_path / "runs")
    assert sorted(after) == ["iter_000002", "iter_000004", "iter_000006"]
    assert {r["local"]["state"] for r in after.values()} == {"committed"}
    assert {r["published"]["state"] for r in after.values()} == {"receipt"}
    assert archived(seaweedfs_bucket, seaweedfs_credentials_path) == ["iter_000002", "iter_000004", "iter_000006"]
    for name in after:
        verified = run_cli("verify", "--artifact-dir", str(run_dir / "checkpoint_artifacts" / name),
                           "--credentials", str(seaweedfs_credentials_path))
        assert verified.returncode == 0, verified.stderr


def test_a_rank_killed_during_its_background_write_commits_nothing_and_the_requeue_resumes(tmp_path):
    killed, run_dir, _ = train(tmp_path, "--parallel", "fsdp", "--steps", "6", "--async-save",
                               env={"CKPTFLOW_TEST_KILL_AT": "trainer-save:rank1-durable-iter4"})
    assert killed.returncode != 0 and "staged iter_000002" in killed.stdout
    arts = run_dir / "checkpoint_artifacts"
    assert not (arts / "iter_000004" / ".posttrain-checkpoint-artifact.json").exists()
    assert (arts / "iter_000002" / ".posttrain-checkpoint-artifact.json").is_file()
    assert rows(tmp_path / "runs")["iter_000004"]["local"]["state"] == "incomplete"
    requeued, _, _ = train(tmp_path, "--parallel", "fsdp", "--steps", "6", "--async-save")
    assert requeued.returncode == 0, requeued.stderr[-4000:]
    assert requeued.stdout.splitlines()[0].startswith("step 3 ")  # resumed from iter 2, not from step 0
    result = result_line(requeued)
    assert result["saved"] == [4, 6] and result["failed"] == []
    after = rows(tmp_path / "runs")
    assert sorted(after) == ["iter_000002", "iter_000004", "iter_000006"]
    assert {r["local"]["state"] for r in after.values()} == {"committed"}
    assert {r["published"]["state"] for r in after.values()} == {"receipt"}
