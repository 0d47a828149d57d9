"""The workflow's plan without Snakemake: ``ckptflow.workflow.plan.Plan`` computed from a runs tree and a
configuration, and compared with the jobs ``snakemake -n`` plans for the same tree."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml
from workflow_helpers import RUN, Flow

from ckptflow.errors import UsageError
from ckptflow.records.manifest import FILENAME as MANIFEST
from ckptflow.workflow.batches import read_batch_plan
from ckptflow.workflow.config import checked_config
from ckptflow.workflow.plan import Plan
from helpers import REPO
from helpers.artifacts import make_artifact

OTHER = "proj/grp/run2/20261130T000000Z"


def _merged(base: dict, over: dict) -> dict:
    """``over`` layered on ``base`` as Snakemake layers a configuration file or ``--config``: nested keys merged."""
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def plan_of(flow: Flow, *, max_batches: int = 2, targets: tuple[str, ...] = (), **overrides) -> Plan:
    """The plan of ``flow`` as the Snakefile makes it: the defaults beside it, the flow's file, the overrides;
    as many batch jobs as ``--cores 2`` runs at once (the workflow tests' Snakemake)."""
    defaults = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    config = checked_config(_merged(_merged(defaults, flow.config), overrides))
    return Plan(config, targets=lambda: targets, max_batches=lambda: max_batches)


def _tree(tmp_path: Path) -> Flow:
    """Four committed artifacts in two runs (one with a legacy plain-text ``.uploaded``), a file:// bucket."""
    (tmp_path / "archive").mkdir()
    flow = Flow(tmp_path / "flow", {"bucket": f"file://{tmp_path / 'archive'}"})
    for run, it in ((RUN, 100), (RUN, 200), (RUN, 300), (OTHER, 300)):
        make_artifact(flow.runs / run, iteration=it, seed=it, model_bytes=4096, shards=1)
    (flow.artifact(200) / ".uploaded").write_text("uploaded\n", encoding="utf-8")
    return flow


def name(it: int) -> str:
    return f"iter_{it:06d}"


# ------------------------------------------------------------------------------ the plan alone


def test_pending_publications_are_every_artifact_without_its_own_receipt(tmp_path):
    flow = _tree(tmp_path)
    plan = plan_of(flow)
    assert plan.committed_artifacts() == [(RUN, name(100)), (RUN, name(200)), (RUN, name(300)), (OTHER, name(300))]
    assert plan.pending_publications() == [
        str(flow.report("publish", 100)), str(flow.report("legacy-receipt", 200)), str(flow.report("publish", 300)),
        str(flow.report("publish", 300, OTHER))]
    manifests = [f"{plan.artifact_dir(run, it)}/{MANIFEST}" for run, it in plan.committed_artifacts()]
    assert plan.publish_all_input() == plan.pending_publications() + manifests
    # verify takes the publication it waits for; the legacy marker with the publication that replaces it
    assert plan.receipt_input(RUN, name(100)) == [str(flow.report("publish", 100))]
    assert plan.receipt_input(RUN, name(200)) == [str(flow.artifact(200) / ".uploaded"),
                                                  str(flow.report("legacy-receipt", 200))]
    assert plan.publication(RUN, name(100)) == 1  # the first publication: no report yet


def test_publications_without_a_bucket_are_refused_by_name_while_planning(tmp_path):
    flow = _tree(tmp_path)
    flow.config["bucket"] = None
    with pytest.raises(UsageError, match="bucket"):
        plan_of(flow).pending_publications()
    with pytest.raises(UsageError, match="bucket"):
        plan_of(flow).all_reports("verify")


def test_batches_take_the_artifacts_without_a_report_and_write_their_member_files(tmp_path):
    flow = _tree(tmp_path)
    plan = plan_of(flow)
    batches = plan.step_batches("publish")
    # the legacy marker is replaced by its own rule, never in a batch; three artifacts make one batch (at least 10
    # per batch unless that leaves one)
    assert sorted(batches) == [(RUN, name(100)), (RUN, name(300)), (OTHER, name(300))]
    (batch,) = set(batches.values())
    members = read_batch_plan(plan.batch_members_path("publish", batch))["members"]
    assert [(m["run"], m["iteration"], m["publication"]) for m in members] == [
        (RUN, name(100), 1), (RUN, name(300), 1), (OTHER, name(300), 1)]
    assert plan.member_batch("publish", RUN, name(100)) == [plan.batch_outcomes_path("publish", batch)]
    assert plan.member_batch("publish", RUN, name(200)) == []
    assert plan.batch_inputs("publish", batch)["done"] == [
        f"{plan.artifact_dir(m['run'], m['iteration'])}/{MANIFEST}" for m in members]
    assert plan.batch_runtime("publish", batch) == 90
    assert set(plan.step_batches("verify")) == {*batches, (RUN, name(200))}


def test_iteration_targets_and_the_scopes_of_restore_scrub_and_keep_free(tmp_path):
    flow = _tree(tmp_path)
    with pytest.raises(UsageError, match="look like a --config override"):
        plan_of(flow, targets=("iter=300",)).iteration()
    with pytest.raises(UsageError, match="several runs"):  # which one is config run's to say
        plan_of(flow, iter=300).restore_target()
    assert plan_of(flow, iter=300, run=OTHER).restore_target() == str(flow.report("restore", 300, OTHER))
    assert plan_of(flow, iter=100).restore_target() == str(flow.report("restore", 100))
    assert plan_of(flow).all_restore_reports() == [
        f"{plan_of(flow).artifact_dir(run, it)}/{MANIFEST}" for run, it in plan_of(flow).committed_artifacts()]
    assert plan_of(flow, scrub_subset="2/3").scrub_report() == f"{flow.config['reports_dir']}/scrub/2-of-3.json"
    assert plan_of(flow).scrub_report() == f"{flow.config['reports_dir']}/scrub/all.json"
    assert plan_of(flow, prune={"keep_free": "10%"}).prune_all_input() == [
        f"{flow.config['reports_dir']}/prune/keep-free.json"]
    assert plan_of(flow).prune_all_input() == plan_of(flow).all_reports("prune")


# ------------------------------------------------------------------------------ the plan and `snakemake -n`

JOB = re.compile(r"^(?:local)?rule (\w+):$")


def dry_run_jobs(flow: Flow, *targets: str, **overrides) -> dict[str, set[tuple[str | None, frozenset[str]]]]:
    """The jobs ``snakemake -n`` plans: {rule: {(output, inputs)}} (a target rule has no output)."""
    out = flow.ok("-n", *targets, **overrides)
    jobs: dict[str, set] = {}
    rule = None
    fields: dict[str, str] = {}

    def close() -> None:
        if rule is not None:
            inputs = frozenset(fields["input"].split(", ")) if fields.get("input") else frozenset()
            jobs.setdefault(rule, set()).add((fields.get("output"), inputs))

    for line in out.splitlines():
        m = JOB.match(line)
        if m:
            close()
            rule, fields = m.group(1), {}
        elif rule is not None and line.startswith("    ") and ": " in line:
            key, _, value = line.strip().partition(": ")
            fields.setdefault(key, value)
        elif rule is not None and not line.startswith("    "):
            close()
            rule = None
    close()
    return jobs


def plan_jobs(plan: Plan, target: str, inputs: list[str]) -> dict[str, set[tuple[str | None, frozenset[str]]]]:
    """The jobs the plan's input functions call for, as Snakemake would: the job of each report the target
    takes, and the job of each input another job needs, while its output is missing or an input of it is
    written by a job planned (the rules of rules/*.smk, named by their outputs)."""
    reports = plan.reports
    jobs: dict[str, set] = {target: {(None, frozenset(inputs))}}
    planned: dict[str, bool] = {}  # output: its job runs

    def job_of(path: str) -> tuple[str, list[str]] | None:
        if not path.startswith(f"{reports}/") or path.endswith(".members.json"):  # a member file: planning's
            return None
        step, _, rest = path[len(reports) + 1:].partition("/")
        run, _, stem = rest.removesuffix(".json").rpartition("/")
        if step == "batches":
            batch = plan.batch_inputs(run, stem)
            return f"{run}_batch", [batch["members"], *batch["done"]]
        if step == "publish":
            return "publish", [f"{plan.artifact_dir(run, stem)}/{MANIFEST}", *plan.member_batch("publish", run, stem)]
        if step == "legacy-receipt":
            return "replace_legacy_receipt", [f"{plan.artifact_dir(run, stem)}/{MANIFEST}"]
        if step == "verify":
            return "verify", [*plan.receipt_input(run, stem), *plan.member_batch("verify", run, stem)]
        if step == "prune" and rest == "keep-free.json":
            return "prune_keep_free", plan.all_reports("verify")
        if step == "prune":
            return "prune", [*plan.receipt_input(run, stem), plan.report("verify", run, stem),
                             *plan.member_batch("prune", run, stem)]
        if step == "scrub":
            return "scrub", []
        raise AssertionError(f"no rule writes {path}")

    def needed(path: str, *, consumed: bool = False) -> bool:
        """Whether the job writing ``path`` runs; a batch's outcomes (a temp() file) only for a member job that
        runs (``consumed``): once gone, it alone reruns nothing."""
        if planned.get(path):
            return True
        found = job_of(path)
        if found is None:
            return False
        rule, ins = found
        temp = [i for i in ins if i.startswith(f"{reports}/batches/") and not i.endswith(".members.json")]
        run_it = [needed(i) for i in ins if i not in temp]  # every input's own job is planned, whatever this one's
        outcome = path.startswith(f"{reports}/batches/")
        planned[path] = (consumed or not outcome) and (not os.path.exists(path) or any(run_it))
        if planned[path]:
            jobs.setdefault(rule, set()).add((path, frozenset(ins)))
            for i in temp:
                needed(i, consumed=True)
        return planned[path]

    if [needed(path) for path in inputs].count(True) == 0 and inputs:
        return {}
    return jobs


@pytest.mark.slow
def test_the_plan_of_publish_all_is_what_snakemake_plans(tmp_path):
    flow = _tree(tmp_path)
    plan = plan_of(flow)
    expected = plan_jobs(plan, "publish_all", plan.publish_all_input())
    assert sorted(expected) == ["publish", "publish_all", "publish_batch", "replace_legacy_receipt"]
    assert dry_run_jobs(flow, "publish_all") == expected


@pytest.mark.slow
def test_the_plan_of_verify_all_and_prune_all_is_what_snakemake_plans(tmp_path):
    flow = _tree(tmp_path)
    plan = plan_of(flow)
    expected = plan_jobs(plan, "verify_all", plan.all_reports("verify"))
    assert sorted(expected) == ["publish", "publish_batch", "replace_legacy_receipt", "verify", "verify_all",
                                "verify_batch"]
    assert dry_run_jobs(flow, "verify_all") == expected
    plan = plan_of(flow)
    assert dry_run_jobs(flow, "prune_all") == plan_jobs(plan, "prune_all", plan.prune_all_input())
    flow.config["prune"] = {"keep_free": "10%", "keep_newest": 1}
    plan = plan_of(flow)
    expected = plan_jobs(plan, "prune_all", plan.prune_all_input())
    assert "prune_keep_free" in expected and "prune" not in expected
    assert dry_run_jobs(flow, "prune_all") == expected


@pytest.mark.slow
def test_once_published_the_plan_of_verify_all_is_what_snakemake_plans(tmp_path):
    flow = _tree(tmp_path)
    flow.ok("publish_all")
    plan = plan_of(flow)
    assert plan.pending_publications() == []
    expected = plan_jobs(plan, "verify_all", plan.all_reports("verify"))
    assert sorted(expected) == ["verify", "verify_all", "verify_batch"]
    assert dry_run_jobs(flow, "verify_all") == expected
    flow.ok("verify_all")
    plan = plan_of(flow)
    assert plan.step_batches("verify") == {}
    assert plan_jobs(plan, "verify_all", plan.all_reports("verify")) == {}
    assert dry_run_jobs(flow, "verify_all") == {}
    assert dry_run_jobs(flow, "scrub_all", scrub_subset="1/2") == plan_jobs(
        plan_of(flow, scrub_subset="1/2"), "scrub_all", [plan_of(flow, scrub_subset="1/2").scrub_report()])
