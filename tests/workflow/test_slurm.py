"""The workflow under Slurm: `snakemake --profile profiles/slurm` on the single-node Slurm of `make test`.

The cluster is the fixture ``slurm_cluster`` (tests/workflow/conftest.py): these tests skip only where the
machine cannot run Slurm or where ``slurm.py up`` failed, and never under CI.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import REPO, slurm
from helpers.artifacts import make_artifact
from helpers.cli import run_cli
from helpers.procs import kill_marked
from helpers.trees import tree_bytes

pytestmark = [pytest.mark.slow, pytest.mark.slurm]

SNAKEMAKE = Path(sys.executable).with_name("snakemake")
RUN = "proj/grp/run1/20261129T000000Z"
TIMEOUT = 600


def _snakemake_cmd(workdir: Path, *args: str, config: dict[str, str], configfile: Path | None = None) -> list[str]:
    cfg = [f"{k}={v}" for k, v in config.items()]
    files = [str(REPO / "config" / "config.yaml"), *([str(configfile)] if configfile else [])]
    # The tracked profile, then this cluster's account and partition in a site profile, as a user runs it.
    site = slurm.site_profile(workdir / "site-profile")
    # timeout -k: SIGTERM alone leaves Snakemake waiting on its Slurm jobs.
    return ["timeout", "-k", "10", str(TIMEOUT), str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "-d", str(workdir),
            "--configfile", *files, "--profile", str(REPO / "profiles" / "slurm"), "--profile", str(site),
            *args, *(["--config", *cfg] if cfg else [])]


def snakemake(workdir: Path, *args: str, config: dict[str, str], env: dict[str, str],
              configfile: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_snakemake_cmd(workdir, *args, config=config, configfile=configfile), capture_output=True,
                          text=True, timeout=TIMEOUT + 30, env={**os.environ, **env})


def slurm_job_ids(output: str) -> list[str]:
    return re.findall(r"has been submitted with SLURM jobid (\d+)", output)


def sacct(job_ids: list[str]) -> list[tuple[str, str, str]]:
    """(JobID, JobName, State) of each job and each of its steps."""
    done = subprocess.run(["sacct", "-n", "-P", "-o", "JobID,JobName,State", "-j", ",".join(job_ids)],
                          capture_output=True, text=True, check=True)
    return [tuple(line.split("|")) for line in done.stdout.splitlines() if line]


def _small_run(tmp_path: Path, bucket: str, credentials: Path, count: int) -> tuple[list[Path], dict, dict]:
    runs = tmp_path / "runs"
    arts = [make_artifact(runs / RUN, iteration=100 * (i + 1), seed=i) for i in range(count)]
    config = {"runs_root": str(runs), "bucket": bucket, "credentials": str(credentials),
              "reports_dir": str(tmp_path / "reports"), "logs_dir": str(tmp_path / "logs")}
    return arts, config, {"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}


def assert_verified(art: Path, credentials: Path) -> None:
    ver = run_cli("verify", "--artifact-dir", str(art), "--credentials", str(credentials))
    assert ver.returncode == 0 and ver.report["status"] == "verified", ver.stderr + ver.stdout


def test_publish_all_runs_every_job_under_slurm_verifies_and_then_has_nothing_to_do(
    slurm_cluster, tmp_path, seaweedfs_bucket, seaweedfs_credentials_path
):
    arts, config, env = _small_run(tmp_path, seaweedfs_bucket, seaweedfs_credentials_path, 3)
    run = snakemake(tmp_path, "publish_all", config=config, env=env)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-5000:]

    # The three publications run in one batch job (one Slurm job, one job step, one process); each
    # artifact keeps its own rule job (a local one), report, receipt and log.
    ids = slurm_job_ids(out)
    assert len(ids) == 1, out[-5000:]
    rows = sacct(ids)
    assert rows and all(state == "COMPLETED" for _, _, state in rows), rows
    steps = [job for job, name, _ in rows if re.fullmatch(rf"{ids[0]}\.\d+", job)]
    assert len(steps) == 1, rows
    assert out.count("localrule publish:") == 3, out[-5000:]
    # The account and partition came from the site profile layered over the tracked one (which names none).
    charged = subprocess.run(["sacct", "-X", "-n", "-P", "-o", "Account,Partition", "-j", ids[0]],
                             capture_output=True, text=True, check=True).stdout.split()
    assert charged == [f"{slurm.ACCOUNT}|{slurm.PARTITION}"], charged
    for art in arts:
        assert (art / ".uploaded").exists()
        assert (tmp_path / "reports" / "publish" / RUN / f"{art.name}.json").exists()
        assert "finished in" in (tmp_path / "logs" / "publish" / RUN / f"{art.name}.log").read_text()
        assert_verified(art, seaweedfs_credentials_path)

    again = snakemake(tmp_path, "-n", "publish_all", config=config, env=env)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stderr[-3000:]


def _wait_for(check, what: str, proc: subprocess.Popen, log: Path, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"snakemake exited ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.2)


def _paused_on(pause: Path, art: Path, proc: subprocess.Popen, log: Path, what: str) -> None:
    """Wait until the publication of ``art`` is paused, letting go every pause of another artifact (each
    stored payload object of a publication reaches the pause point, and the pause file names the artifact
    whose publication wrote it)."""
    def there() -> bool:
        try:
            text = pause.read_text()
        except FileNotFoundError:
            return False
        if f"/{art.name}\n" in text:
            return True
        if text.endswith("\n"):  # a whole line, naming another artifact
            pause.unlink()
        return False
    _wait_for(there, what, proc, log)


@contextlib.contextmanager
def _paused_publish_all(tmp_path: Path, config: dict, env: dict):
    """``publish_all`` started in the background with every publication pausing after each payload object
    it stores (the job's environment reaches the job step: the profile's sbatch exports it), until the
    pause file it yields is removed; yields the process, its log and that file. A process still running on
    the way out is killed, and so is any process left of its jobs (found by the pause file in their
    environment): the test cluster loses track of a cancelled job's step once its parent has exited."""
    pause = tmp_path / "paused"
    paused_env = {**env, "CKPTFLOW_TEST_PAUSE_AT": "publish:after-payload", "CKPTFLOW_TEST_PAUSE_FILE": str(pause)}
    log = tmp_path / "snakemake-cancelled.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(_snakemake_cmd(tmp_path, "publish_all", config=config), stdout=fh,
                                stderr=subprocess.STDOUT, text=True, env={**os.environ, **paused_env})
    try:
        yield proc, log, pause
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_marked("CKPTFLOW_TEST_PAUSE_FILE", str(pause))


def _nothing_left_to_publish(tmp_path: Path, config: dict, env: dict) -> None:
    again = snakemake(tmp_path, "-n", "publish_all", config=config, env=env)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr


def test_a_publish_job_cancelled_mid_upload_fails_and_the_next_run_converges_with_nothing_lost(
    slurm_cluster, tmp_path, seaweedfs_bucket, seaweedfs_credentials_path
):
    arts, config, env = _small_run(tmp_path, seaweedfs_bucket, seaweedfs_credentials_path, 2)
    before = {art: tree_bytes(art) for art in arts}
    # Every publication stops after each payload object it stores, so the cancel at the first stop lands
    # in the middle of the upload.
    with _paused_publish_all(tmp_path, config, env) as (proc, log, pause):
        _wait_for(pause.exists, "a publish job paused mid-upload", proc, log)
        ids = slurm_job_ids(log.read_text())
        assert ids, log.read_text()[-4000:]
        subprocess.run(["scancel", *ids], check=True)
        assert proc.wait(timeout=TIMEOUT + 30) != 0, log.read_text()[-4000:]
    out = log.read_text()
    assert "Error in group publish_batch" in out or "Error in rule publish" in out, out[-4000:]
    assert any(state.startswith("CANCELLED") for _, _, state in sacct(ids)), sacct(ids)
    assert not all((art / ".uploaded").exists() for art in arts)

    pause.unlink(missing_ok=True)
    rerun = snakemake(tmp_path, "publish_all", config=config, env=env)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-5000:]
    for art in arts:
        after = tree_bytes(art)
        assert ".uploaded" in after
        assert {k: v for k, v in after.items() if k not in (".uploaded", ".posttrain-part-digests.json")} == before[art]
        assert_verified(art, seaweedfs_credentials_path)
    _nothing_left_to_publish(tmp_path, config, env)


def test_one_artifact_that_fails_its_publication_fails_only_its_own_target_and_the_rerun_retries_only_it(
    slurm_cluster, tmp_path, seaweedfs_bucket, seaweedfs_credentials_path
):
    arts, config, env = _small_run(tmp_path, seaweedfs_bucket, seaweedfs_credentials_path, 3)
    # One byte of the second artifact's model changes after sealing: its digest no longer matches the
    # manifest, so its publication is refused; its batch-mates are published in the same batch job.
    bad = arts[1] / "model.pt"
    good_bytes = bad.read_bytes()
    bad.write_bytes(bytes([good_bytes[0] ^ 0xFF]) + good_bytes[1:])
    run = snakemake(tmp_path, "publish_all", config=config, env=env)
    out = run.stdout + run.stderr
    assert run.returncode != 0, out[-5000:]
    ids = slurm_job_ids(out)
    assert len(ids) == 1, out[-5000:]
    assert all(state == "COMPLETED" for _, _, state in sacct(ids)), sacct(ids)  # the batch itself completed
    assert "Error in rule publish:" in out and "Error in rule publish_batch" not in out, out[-5000:]
    reports, logs = tmp_path / "reports" / "publish" / RUN, tmp_path / "logs" / "publish" / RUN
    for art in (arts[0], arts[2]):
        assert (art / ".uploaded").exists() and (reports / f"{art.name}.json").exists()
        assert_verified(art, seaweedfs_credentials_path)
    assert not (arts[1] / ".uploaded").exists() and not (reports / f"{arts[1].name}.json").exists()
    assert "model.pt" in (logs / f"{arts[1].name}.log").read_text()

    # Only the failed artifact is pending; with its bytes back, the rerun publishes it alone.
    pending = snakemake(tmp_path, "-n", "publish_all", config=config, env=env)
    assert pending.returncode == 0, pending.stderr[-3000:]
    assert len(re.findall(r"^(?:local)?rule publish:$", pending.stdout, re.M)) == 1, pending.stdout[-3000:]
    assert f"output: {reports}/{arts[1].name}.json" in pending.stdout, pending.stdout[-3000:]
    bad.write_bytes(good_bytes)
    rerun = snakemake(tmp_path, "publish_all", config=config, env=env)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-5000:]
    assert (rerun.stdout + rerun.stderr).count("localrule publish:") == 1
    for art in arts:
        assert_verified(art, seaweedfs_credentials_path)
    _nothing_left_to_publish(tmp_path, config, env)


def test_a_batch_job_cancelled_mid_batch_leaves_each_artifact_published_with_its_receipt_or_pending(
    slurm_cluster, tmp_path, seaweedfs_bucket, seaweedfs_credentials_path
):
    arts, config, env = _small_run(tmp_path, seaweedfs_bucket, seaweedfs_credentials_path, 3)
    before = {art: tree_bytes(art) for art in arts}
    # Each publication of the batch stops after every payload object it stores: the first is let go
    # each time, the second is cancelled at its first stop (one artifact published, one mid-upload, one
    # not started).
    with _paused_publish_all(tmp_path, config, env) as (proc, log, pause):
        _wait_for(pause.exists, "the first publication paused mid-upload", proc, log)
        _paused_on(pause, arts[1], proc, log, "the second publication paused mid-upload")
        assert (arts[0] / ".uploaded").exists()
        ids = slurm_job_ids(log.read_text())
        assert len(ids) == 1, log.read_text()[-4000:]
        subprocess.run(["scancel", *ids], check=True)
        assert proc.wait(timeout=TIMEOUT + 30) != 0, log.read_text()[-4000:]
    out = log.read_text()
    assert "Error in rule publish_batch" in out, out[-4000:]
    assert any(state.startswith("CANCELLED") for _, _, state in sacct(ids)), sacct(ids)
    published = [art for art in arts if (art / ".uploaded").exists()]
    assert published == [arts[0]], published
    assert_verified(arts[0], seaweedfs_credentials_path)
    for art in arts[1:]:  # pending: no receipt, every file it had as it was
        after = tree_bytes(art)
        assert ".uploaded" not in after and {k: after.get(k) for k in before[art]} == before[art]
    pending = snakemake(tmp_path, "-n", "publish_all", config=config, env=env)
    assert pending.returncode == 0, pending.stderr[-3000:]
    assert len(re.findall(r"^(?:local)?rule publish:$", pending.stdout, re.M)) == 2, pending.stdout[-3000:]

    pause.unlink(missing_ok=True)
    rerun = snakemake(tmp_path, "publish_all", config=config, env=env)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-5000:]
    for art in arts:
        after = tree_bytes(art)
        assert ".uploaded" in after and {k: after.get(k) for k in before[art]} == before[art]
        assert_verified(art, seaweedfs_credentials_path)
    _nothing_left_to_publish(tmp_path, config, env)


def test_materialize_teacher_under_slurm_builds_from_the_archive_and_the_teacher_loads(
    slurm_cluster, tmp_path, kit, seaweedfs_bucket, seaweedfs_credentials_path
):
    from transformers import AutoModelForCausalLM
    from workflow_helpers import Flow

    from ckptflow.archive.publish import publish_artifact
    from ckptflow.store.open import open_bucket_arg

    # The artifact exists only in the archive: merged elsewhere (locally) and published there.
    src = Flow(tmp_path / "elsewhere", {"base": str(kit.base), "run": RUN, "materialize": {"min_tensors": 1},
                                        "merge": {"300": {"mode": "avg", "experts": [str(p) for p in kit.experts]}}})
    src.ok("merge_experts", iter=300)
    publish_artifact(src.artifact(), open_bucket_arg(seaweedfs_bucket, str(seaweedfs_credentials_path)),
                     f"{RUN}/checkpoints", progress=False)

    flow = Flow(tmp_path / "cluster", {"base": str(kit.base), "run": RUN, "materialize": {"min_tensors": 1},
                                       "bucket": f"s3://{seaweedfs_bucket}",
                                       "credentials": str(seaweedfs_credentials_path)})
    flow.root.mkdir(parents=True)
    configfile = flow.root / "test-config.yaml"
    configfile.write_text(json.dumps(flow.config), encoding="utf-8")  # YAML reads JSON
    run = snakemake(flow.root, "materialize_teacher", config={"iter": "300"}, env=flow.env, configfile=configfile)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-5000:]
    ids = slurm_job_ids(out)
    assert len(ids) >= 1, out[-5000:]  # materialize (it fetches the archive itself for its build): a Slurm job
    rows = sacct(ids)
    assert rows and all(state == "COMPLETED" for _, _, state in rows), rows

    uri = f"s3://{seaweedfs_bucket}/{RUN}/checkpoint_artifacts/iter_000300"
    marker = json.loads((flow.teacher() / ".materialized").read_text())
    assert marker["source"]["uri"] == uri and not flow.runs.exists()
    model, info = AutoModelForCausalLM.from_pretrained(str(flow.teacher()), output_loading_info=True)
    assert all(not v for v in info.values()), info
    assert model.config.model_type == "qwen3"
    again = snakemake(flow.root, "-n", "materialize_teacher", config={"iter": "300"}, env=flow.env,
                      configfile=configfile)
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr
