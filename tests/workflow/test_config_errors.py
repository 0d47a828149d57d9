"""The workflow speaks ``--config``: what a target needs is checked before Snakemake plans a job, each
mistake one line naming the key and its remedy; a failed job ends in its one-line error; the status table
is shown on every invocation; no ``Shell command: None``. Real Snakemake, output read as a person sees it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from workflow_helpers import RUN, Flow

from ckptflow.workflow.config import config_remedy
from helpers.artifacts import make_artifact
from helpers.cli import run_cli

OTHER_RUN = "proj/grp/run2/20261130T000000Z"


@pytest.fixture(scope="module")
def flow(tmp_path_factory: pytest.TempPathFactory) -> Flow:
    """Committed iterations 300 and 400 of RUN and 500 of OTHER_RUN; the tests only dry-run it."""
    root = tmp_path_factory.mktemp("config-errors")
    # Neither bucket nor credentials from the environment: the configuration alone says.
    flow = Flow(root / "flow", env={"CKPTFLOW_BUCKET": "", "CKPTFLOW_CREDENTIALS": ""})
    for run, iteration in ((RUN, 300), (RUN, 400), (OTHER_RUN, 500)):
        make_artifact(flow.runs / run, iteration=iteration, model_bytes=1000, shards=1, seed=iteration)
    base = root / "base"
    base.mkdir()
    (base / "config.json").write_text("{}", encoding="utf-8")
    (root / "not-a-model").mkdir()
    (root / "bad-credentials.json").write_text('{"aws_access_key_id": "k"', encoding="utf-8")
    return flow


def _written(flow: Flow) -> list[str]:
    """Every file under the flow's directory but Snakemake's own (.snakemake/) and the test's config."""
    return sorted(os.path.join(d, f) for d, dirs, files in os.walk(flow.root) for f in files
                  if ".snakemake" not in Path(d).relative_to(flow.root).parts and f != "test-config.yaml")


def _refusal(flow: Flow, *args: str, **overrides) -> str:
    """The one line a refused dry-run prints (anything else would be a traceback or a schema dump)."""
    before = _written(flow)
    done = flow.run("-n", *args, **overrides)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    lines = [line for line in done.stderr.splitlines() if line.startswith("ckptflow: ")]
    assert len(lines) == 1, out
    for word in ("Traceback", "Exception", "On instance", "Failed validating", 'File "'):
        assert word not in out, out
    assert _written(flow) == before  # a dry run writes nothing
    return lines[0]


@pytest.mark.slow
def test_an_unknown_key_is_named_with_the_closest_known_one(flow):
    line = _refusal(flow, bucekt="s3://b")
    assert "unknown config key 'bucekt' (did you mean 'bucket'?)" in line, line
    line = _refusal(flow, materialize='{"min_tensor": 1}')
    assert "'materialize.min_tensor' (did you mean 'materialize.min_tensors'?)" in line, line
    line = _refusal(flow, materialize='{"min_tensors": -1}')
    assert "config materialize.min_tensors is -1" in line and "--config 'materialize=" in line, line


@pytest.mark.slow
def test_publication_needs_a_bucket_and_credentials_that_parse(flow, tmp_path):
    line = _refusal(flow, "publish_all")
    assert "config bucket is not set" in line and "--config bucket=s3://B" in line, line
    missing = flow.root / "no-such-runs"
    line = _refusal(flow, "publish_all", runs_root=missing, bucket="s3://ckpts")
    assert f"config runs_root {missing} does not exist" in line and "--config runs_root=" in line, line
    archive = tmp_path / "arch"
    archive.mkdir()
    line = _refusal(flow, "publish_all", bucket="s3://ckpts", credentials=str(tmp_path / "nope.json"))
    assert f"config credentials: credentials file {tmp_path / 'nope.json'} does not exist" in line, line
    assert "--config credentials=" in line, line
    bad = flow.root.parent / "bad-credentials.json"
    line = _refusal(flow, "verify_all", bucket="s3://ckpts", credentials=str(bad))
    assert f"config credentials: credentials file {bad}" in line and "--config credentials=" in line, line
    # A file:// archive needs no credentials: the steps would not read the file, nor does planning.
    planned = flow.planned("publish_all", bucket=f"file://{archive}", credentials=str(bad))
    assert sorted(planned) == ["publish"] * 3 + ["publish_all", "publish_batch"]  # one batch of three


@pytest.mark.slow
def test_an_iteration_scoped_target_names_the_runs_and_iterations_there_are(flow):
    base = str(flow.root.parent / "base")
    line = _refusal(flow, "materialize_teacher", base=base)
    assert "config iter is not set" in line and "300, 400, 500" in line and "--config iter=" in line, line
    line = _refusal(flow, "materialize_teacher", iter=301, base=base)
    assert "iter_301" in line and "300, 400, 500" in line and "--config run=" in line, line
    line = _refusal(flow, "materialize_teacher", iter=300, run="proj/grp/run9/20261129T000000Z", base=base)
    assert "config run proj/grp/run9/20261129T000000Z is not a run" in line and f"--config run={RUN}" in line, line
    line = _refusal(flow, "materialize_teacher", iter=500, run=RUN, base=base)
    assert f"config run {RUN} holds no committed checkpoint_artifacts/iter_500 (committed: 300, 400)" in line, line
    assert "--config iter=400" in line, line


@pytest.mark.slow
def test_a_merge_needs_its_recipe_and_its_experts(flow):
    line = _refusal(flow, "merge_experts", iter=300)
    assert "config merge has no recipe for iteration 300" in line, line
    line = _refusal(flow, "merge_experts", iter=300, merge='{"300": {"mode": "avg", "experts": "x.pt"}}')
    assert "config merge.300.experts: no such file x.pt" in line, line


@pytest.mark.slow
def test_a_merge_whose_experts_were_pruned_names_the_restore_not_the_recipe(tmp_path):
    """The experts of the recipe are archived artifacts' model.pt, pruned since (the CLI's publish and
    prune-verified on a file:// archive): the recipe is right, the bytes are in the archive."""
    flow = Flow(tmp_path / "flow", env={"CKPTFLOW_BUCKET": "", "CKPTFLOW_CREDENTIALS": ""})
    archive = tmp_path / "archive"
    archive.mkdir()
    env = {"CKPTFLOW_CACHE_DIR": flow.env["CKPTFLOW_CACHE_DIR"]}
    experts = []
    for iteration in (100, 200):
        art = make_artifact(flow.runs / RUN, iteration=iteration, model_bytes=1000, shards=1, seed=iteration)
        (art / "optim.pt").unlink()  # the stale unselected file: prune keeps an artifact holding it
        assert run_cli("publish", "--artifact-dir", str(art), "--bucket", f"file://{archive}", env=env).returncode == 0
        experts.append(str(art / "model.pt"))
    assert run_cli("probe", "--bucket", f"file://{archive}", "--prefix", "proj/grp/run1", env=env).returncode == 0
    pruned = run_cli("prune-verified", "--paths", str(flow.artifact(100)), env=env)
    assert pruned.returncode == 0 and not os.path.exists(experts[0]), pruned.stderr
    recipe = json.dumps({"300": {"mode": "avg", "experts": ",".join(experts)}})
    line = _refusal(flow, "merge_experts", iter=300, run=RUN, merge=recipe, bucket=f"file://{archive}")
    assert f"config merge.300.experts: {experts[0]} (artifact {flow.artifact(100)}) was pruned" in line, line
    assert "snakemake restore_all" in line and f"ckptflow restore --artifact-dir {flow.artifact(100)}" in line, line
    assert "fix the expert paths" not in line and experts[1] not in line, line
    # A path that is no payload of an archived artifact is still a typo in the recipe.
    recipe = json.dumps({"300": {"mode": "avg", "experts": f"{experts[1]},{tmp_path / 'x.pt'}"}})
    line = _refusal(flow, "merge_experts", iter=300, run=RUN, merge=recipe, bucket=f"file://{archive}")
    assert f"no such file {tmp_path / 'x.pt'}" in line and "fix the expert paths" in line, line


@pytest.mark.slow
@pytest.mark.parametrize("words", [("--", "materialize_teacher", "--config", "iter=300"),
                                   ("--", "materialize_teacher", "iter=300"), ("materialize_teacher", "iter=300")])
def test_a_config_override_taken_as_a_target_is_refused_saying_where_it_goes(flow, words):
    """``-- materialize_teacher --config iter=300``: after ``--`` every word is a target, so Snakemake would
    plan files named ``--config`` and ``iter=300`` with config iter unset (and the refusal would suggest
    another iteration); ``iter=300`` without ``--config`` is a target too. The override is named as such, with
    the place it goes."""
    line = _refusal(flow, *words)
    assert "'iter=300'" in line and "look like a --config override" in line and "after `--`" in line, line
    assert "--config iter=300 -- TARGET" in line and "config iter is not set" not in line, line
    if "--config" in words:
        assert "'--config'" in line, line
    # Before `--`, the same override is applied.
    assert sorted(flow.planned("materialize_teacher", iter=300, base=flow.root.parent / "base")) == [
        "materialize", "materialize_teacher"]


@pytest.mark.slow
def test_a_wrong_keep_free_is_named_by_its_config_key_before_planning(flow):
    for value in ("20 gigs", "20"):
        line = _refusal(flow, "prune_all", prune=json.dumps({"keep_free": value}))
        assert f"config prune.keep_free is {value!r}" in line and "unit" in line, line
        assert "--config 'prune={\"keep_free\": \"20G\"}'" in line and "--keep-free" not in line, line


@pytest.mark.slow
def test_a_teacher_needs_a_base_that_holds_a_config(flow):
    line = _refusal(flow, "materialize_teacher", iter=300)
    assert "config base is not set" in line and "--config base=" in line, line
    missing = flow.root.parent / "no-such-base"
    assert f"config base {missing} does not exist" in _refusal(flow, "materialize_teacher", iter=300, base=missing)
    empty = flow.root.parent / "not-a-model"
    line = _refusal(flow, "materialize_teacher", iter=300, base=empty)
    assert f"config base {empty} holds no config.json" in line and "--config base=" in line, line
    assert sorted(flow.planned("materialize_teacher", iter=300, base=flow.root.parent / "base")) == [
        "materialize", "materialize_teacher"]


@pytest.mark.slow
def test_a_failed_job_ends_in_its_one_line_error_and_the_log_keeps_the_details(tmp_path):
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{tmp_path / 'no-such-archive'}"})
    make_artifact(flow.runs / RUN, iteration=300, model_bytes=1000, shards=1)
    done = flow.run("publish_all")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    log = Path(flow.config["logs_dir"]) / "publish" / RUN / "iter_000300.log"
    line = f"ckptflow: archive root {tmp_path / 'no-such-archive'} does not exist"
    lines = [x for x in done.stderr.splitlines() if x.startswith(line)]
    assert len(lines) == 1 and lines[0].endswith(f"(details: {log})"), out
    # The line is among the last Snakemake prints for the job: above its RuleException and error block.
    tail = done.stderr.splitlines()[done.stderr.splitlines().index(lines[0]):]
    assert any(x.startswith("Error in rule publish:") for x in tail[:6]), out
    assert "Traceback" not in out and "Shell command" not in out, out
    assert "Traceback" in log.read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_status_table_is_printed_on_every_invocation_and_no_shell_command_line(tmp_path):
    flow = Flow(tmp_path / "flow")
    make_artifact(flow.runs / RUN, iteration=300, model_bytes=1000, shards=1)
    first = flow.run("status")
    assert first.returncode == 0 and "Shell command" not in first.stdout + first.stderr, first.stderr
    again = flow.run("status")
    assert again.returncode == 0, again.stderr
    assert "Nothing to be done" in again.stdout + again.stderr
    rows = [line for line in again.stdout.splitlines() if "iter_000300" in line]
    assert len(rows) == 1 and RUN in rows[0], again.stdout
    assert rows == [line for line in first.stdout.splitlines() if "iter_000300" in line]
    assert json.loads((tmp_path / "flow" / "reports" / "status.json").read_text())["rows"]


def test_a_library_remedy_is_spelled_in_config_keys():
    assert config_remedy("pass --credentials FILE or set CKPTFLOW_CREDENTIALS") == (
        "pass --config credentials=FILE or set CKPTFLOW_CREDENTIALS")
    assert config_remedy("pass --bucket (a name, s3://B)").startswith("pass --config bucket=... (a name")
    assert config_remedy("pass --force to rebuild", "materialize") == (
        "pass --config 'materialize={\"force\": true}' to rebuild")
    assert config_remedy("pass --min-tensors 1") == "pass --config 'materialize={\"min_tensors\": 1}'"
    assert config_remedy("pass --force-age 1h") == "pass --force-age 1h"  # another flag, left alone
