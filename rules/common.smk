import os
import sys
from functools import cache
from types import SimpleNamespace

from snakemake.utils import validate

from ckptflow import artifact as ckptflow_artifact
from ckptflow import workflow_config as ckptflow_config
from ckptflow import workflow_plan as ckptflow_plan
from ckptflow import workflow_steps as ckptflow_steps
from ckptflow.errors import CkptflowError, UsageError
from ckptflow.records.manifest import FILENAME as MANIFEST
from ckptflow.records.receipt import FILENAME as RECEIPT
from ckptflow.records.receipt import belonging_receipt, is_legacy_receipt

# --config iter=300 arrives as an int, nested overrides as strings: type them, then validate, each mistake
# one line naming the key (an unknown one with the closest known key), not Snakemake's traceback or the
# schema dump. Every input function below that can refuse is wrapped the same way (one_line_errors).
try:
    config.update(ckptflow_config.checked_config(config))
    ckptflow_config.refuse_overrides_as_targets(
        ckptflow_config.words_after_double_dash(sys.argv)
    )
except CkptflowError as exc:
    ckptflow_config.exit_with(exc)


# Valid already: this fills in the defaults.
validate(config, schema="../schemas/config.schema.json")

RUNS = config["runs_root"].rstrip("/")
REPORTS = config["reports_dir"].rstrip("/")
LOGS = config["logs_dir"].rstrip("/")
STAGE = config["stage_dir"].rstrip("/")
TEACHERS = config["teachers_dir"].rstrip("/")
ARTIFACT = ckptflow_plan.artifact_path(RUNS, "{run}", "{iteration}")


wildcard_constraints:
    iteration=r"iter_[0-9]+",


def committed_artifacts():
    """(run, iteration) of every artifact whose native manifest is committed: the runs `ckptflow status`
    shows, found without walking into a run's checkpoints (one listing per directory above the runs).
    """
    return ckptflow_artifact.committed_artifacts(RUNS)


def artifact_dir(run, iteration):
    """The directory of one artifact under runs_root (ARTIFACT with its wildcards filled in)."""
    return ckptflow_plan.artifact_path(RUNS, run, iteration)


def is_legacy(run, iteration):
    """True when the artifact's .uploaded is a legacy plain-text marker: it proves nothing."""
    return is_legacy_receipt(artifact_dir(run, iteration))


@cache
def own_receipt(run, iteration):
    """The artifact's receipt when it is its own, else None (read once per planning)."""
    return belonging_receipt(artifact_dir(run, iteration))


def receipt_belongs(run, iteration):
    """True when the artifact holds a receipt that is its own."""
    return own_receipt(run, iteration) is not None


def publish_report(run, iteration):
    return f"{REPORTS}/publish/{run}/{iteration}.json"


def archive_schemes(run, iteration):
    """The schemes of the stores the jobs of one artifact open: its own receipt's destination; without one,
    the destinations its step reports name (a lost receipt is re-derived there), else the bucket, which
    must then be set. Checked while planning with the words the job would use.
    """
    receipt = own_receipt(run, iteration)
    if receipt is not None:
        return [receipt.destination.scheme]
    reports = ckptflow_plan.step_reports(REPORTS, run, iteration)
    recorded = ckptflow_plan.recorded_destinations(reports)
    if recorded:
        return [dest.scheme for dest in recorded]
    return [ckptflow_config.require_bucket(config["bucket"]).scheme]


def require_destination(run, iteration):
    """What the jobs of one artifact need to reach its archive: the bucket when they publish it to the
    bucket, and credentials that exist and parse when a configured file is what opens it.
    """
    schemes = archive_schemes(run, iteration)
    ckptflow_config.require_credentials(config["credentials"], schemes)


@ckptflow_config.one_line_errors
def get_pending_publications(wildcards):
    """The pending publications: a report per committed artifact without a receipt that belongs to it
    (missing, legacy, full-checkpoint, another artifact's); a legacy marker is replaced by publication.
    """
    ckptflow_config.require_runs_root(RUNS)
    pending = [
        (run, it) for run, it in committed_artifacts() if not receipt_belongs(run, it)
    ]
    for run, it in pending:
        require_destination(run, it)
    return [
        (
            f"{REPORTS}/legacy-receipt/{run}/{it}.json"
            if is_legacy(run, it)
            else publish_report(run, it)
        )
        for run, it in pending
    ]


def get_publish_all_input(wildcards):
    """The pending publications, and the manifest of every committed artifact: a target rule without
    inputs always runs, and `snakemake -n publish_all` says "Nothing to be done" when nothing is pending.
    """
    manifests = [
        f"{artifact_dir(run, it)}/{MANIFEST}" for run, it in committed_artifacts()
    ]
    return get_pending_publications(wildcards) + manifests


@ckptflow_config.one_line_errors
def get_receipt_input(wildcards):
    """What verify and prune take for the receipt. The set of files must not change when a publication
    completes (a changed set of inputs reruns a job): the publish report once it exists or while the
    receipt is pending, the receipt itself for an artifact published outside the workflow, and for a
    legacy marker (or one replaced before) the marker with the publication that replaces it.
    """
    run, it = wildcards.run, wildcards.iteration
    receipt = f"{artifact_dir(run, it)}/{RECEIPT}"
    replaced = f"{REPORTS}/legacy-receipt/{run}/{it}.json"
    if is_legacy(run, it) or (os.path.exists(replaced) and receipt_belongs(run, it)):
        return [receipt, replaced]
    if os.path.exists(publish_report(run, it)) or not receipt_belongs(run, it):
        return [publish_report(run, it)]
    return [receipt]


@ckptflow_config.one_line_errors
def get_publication(wildcards):
    """The publish job's rerun trigger (see rules/publish.smk); a job that will publish has its destination
    checked here, while planning (verify_all and prune_all plan publications too).
    """
    if not receipt_belongs(wildcards.run, wildcards.iteration):
        require_destination(wildcards.run, wildcards.iteration)
    return ckptflow_plan.publication_number(
        get_artifact_dir(wildcards),
        publish_report(wildcards.run, wildcards.iteration),
    )


@ckptflow_config.one_line_errors
def get_all_verify_reports(wildcards):
    ckptflow_config.require_runs_root(RUNS)
    artifacts = committed_artifacts()
    # Every verify job opens the archive (and publishes first without a receipt).
    for run, it in artifacts:
        require_destination(run, it)
    return [f"{REPORTS}/verify/{run}/{it}.json" for run, it in artifacts]


@ckptflow_config.one_line_errors
def get_all_prune_reports(wildcards):
    ckptflow_config.require_runs_root(RUNS)
    artifacts = committed_artifacts()
    # Every prune job opens the archive (and publishes first without a receipt).
    for run, it in artifacts:
        require_destination(run, it)
    return [f"{REPORTS}/prune/{run}/{it}.json" for run, it in artifacts]


def get_prune_round(wildcards):
    """The prune job's rerun trigger: see ckptflow.workflow_plan.prune_round."""
    return ckptflow_plan.prune_round(
        f"{REPORTS}/prune/{wildcards.run}/{wildcards.iteration}.json"
    )


def get_keep_free_round(wildcards):
    """The keep-free prune job's rerun trigger: see ckptflow.workflow_plan.prune_round."""
    return ckptflow_plan.prune_round(f"{REPORTS}/prune/keep-free.json")


def get_prune_all_input(wildcards):
    """Every artifact's prune report, or with config prune.keep_free the one keep-free report."""
    if ckptflow_plan.keep_free_target(config) is None:
        return get_all_prune_reports(wildcards)
    return [f"{REPORTS}/prune/keep-free.json"]


# ------------------------------------------------------------------ iteration-scoped targets


def get_iteration():
    """config iter, required by merge_experts and materialize_teacher (an `iter=300` Snakemake took as a
    target is named as such first)."""
    # The targets Snakemake parsed: known once planning started.
    if workflow.dag_settings is not None:
        ckptflow_config.refuse_overrides_as_targets(workflow.dag_settings.targets)
    return ckptflow_config.require_iteration(config["iter"], RUNS)


@cache
def get_target(may_be_new):
    """(run, iter_N) of config iter: config run, else the one run holding it; a configured run or
    iteration that is not on disk is refused unless the target writes or fetches it (may_be_new).
    """
    return ckptflow_config.resolve_target(
        RUNS, get_iteration(), config["run"], may_be_new=may_be_new
    )


@ckptflow_config.one_line_errors
def get_merge_target(wildcards):
    """merge_experts: the recipe of config iter, its experts and (tv) its base, checked before planning."""
    iteration = get_iteration()
    recipe = ckptflow_config.require_merge_recipe(config, iteration)
    run, name = get_target(True)
    ckptflow_config.require_experts(recipe["experts"], iteration)
    if recipe["mode"] == "tv":
        key = f"merge.{iteration}.base" if recipe.get("base") else "base"
        ckptflow_config.require_base(recipe.get("base") or config["base"], key=key)
    return f"{REPORTS}/merge/{run}/{name}.json"


@ckptflow_config.one_line_errors
def get_teacher_target(wildcards):
    """materialize_teacher: the iteration, the run, the base and, for a teacher built from the archive,
    the bucket and credentials, checked before planning (what the materialize job needs).
    """
    iteration = get_iteration()
    has_recipe = ckptflow_config.merge_recipe(config, iteration) is not None
    bucket = config["bucket"] or os.environ.get("CKPTFLOW_BUCKET")
    run, name = get_target(has_recipe or bool(bucket))
    source = teacher_source(run, name)
    ckptflow_config.require_base(config["base"])
    # A receipt with a file:// copy is served by it whatever the credentials: the job skips a copy they cannot open.
    schemes = (
        (source.schemes or (source.uri.partition("://")[0],))
        if source.kind == "archive"
        else ()
    )
    if schemes and "file" not in schemes:
        ckptflow_config.require_credentials(config["credentials"], schemes)
    return f"{REPORTS}/materialize/{run}/{name}.json"


def iteration_of(wildcards):
    return ckptflow_config.parse_iteration(wildcards.iteration)


def get_artifact_dir(wildcards):
    return artifact_dir(wildcards.run, wildcards.iteration)


@ckptflow_config.one_line_errors
def get_merge_recipe(wildcards):
    """The recipe of the iteration, a tv merge without its own base on the top-level base."""
    recipe = ckptflow_config.require_merge_recipe(config, iteration_of(wildcards))
    if recipe["mode"] == "tv" and not recipe.get("base"):
        return {**recipe, "base": config["base"]}
    return recipe


def get_merge_experts(wildcards):
    return list(get_merge_recipe(wildcards)["experts"])


@cache
def teacher_source(run, iteration):
    return ckptflow_plan.teacher_source(
        artifact_dir(run, iteration),
        run,
        bucket=config["bucket"],
        has_recipe=ckptflow_config.merge_recipe(
            config, ckptflow_config.parse_iteration(iteration)
        )
        is not None,
    )


@ckptflow_config.one_line_errors
def get_teacher_input(wildcards):
    """The local artifact when its model payload is present with its recorded size (or the merge that
    writes it); nothing from the archive: materialize decides on the teacher first and fetches into
    the stage only what a build reads (an intact teacher is skipped without a download).
    """
    source = teacher_source(wildcards.run, wildcards.iteration)
    if source.kind == "merge":
        return [f"{REPORTS}/merge/{wildcards.run}/{wildcards.iteration}.json"]
    if source.kind == "local":
        return [f"{source.artifact_dir}/{MANIFEST}"]
    return []


@ckptflow_config.one_line_errors
def get_teacher_ckpt_dir(wildcards):
    """The local artifact materialize reads: in place, or once pruned through its receipt (every destination
    it lists is tried); None when there is no local artifact and it builds from the bucket.
    """
    source = teacher_source(wildcards.run, wildcards.iteration)
    return (
        None
        if source.kind == "archive" and not source.receipt
        else str(source.artifact_dir)
    )


@ckptflow_config.one_line_errors
def get_teacher_uri(wildcards):
    """The archive materialize builds from (fetched into the fetch rule's stage when a build needs it), so
    the teacher records the archive's identity; None when the local artifact is used in place. For a pruned
    artifact, the current destination its receipt names: materialize tries every destination it lists.
    """
    source = teacher_source(wildcards.run, wildcards.iteration)
    return source.uri if source.kind == "archive" else None


@ckptflow_config.one_line_errors
def get_fetch_uri(wildcards):
    """The archive of the artifact: named by its receipt, or under the bucket when there is no local copy."""
    source = teacher_source(wildcards.run, wildcards.iteration)
    if source.uri is None:
        raise UsageError(
            f"{source.artifact_dir} is used in place ({source.why}); nothing to fetch",
            remedy="target materialize_teacher; it fetches only when the payload is gone",
        )
    return source.uri


@ckptflow_config.one_line_errors
def get_fetch_receipt_dir(wildcards):
    """The pruned artifact whose receipt names the archive to fetch (every destination it lists is tried),
    None when the archive is found under the bucket."""
    source = teacher_source(wildcards.run, wildcards.iteration)
    return str(source.artifact_dir) if source.receipt else None


def get_stage_root(wildcards):
    return f"{STAGE}/{wildcards.run}"


def get_teacher_out(wildcards):
    return f"{TEACHERS}/{wildcards.run}/{wildcards.iteration}"


@ckptflow_config.one_line_errors
def get_records_fingerprint(wildcards):
    """The status rule's rerun trigger: it reruns when what status would print changed (a record, or a
    file a record names gone or resized).

    Evaluated whenever the status job is planned, which is how the table reaches the terminal on every
    invocation and a report is never older than its table: Snakemake runs no job (and no onstart or
    onsuccess hook) when the table is up to date, and `--report` runs no job at all, so the job alone
    could do neither. show_status prints the current table here when Snakemake executes (a run or a
    dry-run; the job itself prints nothing), and rewrites it when it plans without executing (--report,
    --summary, --dag), so those read the table of now.
    """
    ckptflow_config.require_runs_root(RUNS)
    status = ckptflow_plan.show_status(
        RUNS,
        REPORTS,
        STAGE,
        TEACHERS,
        rules.status.output.json,
        rules.status.output.txt,
        executing=workflow.executor_plugin is not None,
    )
    return ckptflow_plan.records_fingerprint(
        RUNS, REPORTS, STAGE, TEACHERS, status=status
    )


# ------------------------------------------------------------------ restore


def get_restore_input(wildcards):
    """The artifact directory (and a directory that lost a payload): its mtime is the rerun trigger."""
    return ckptflow_plan.restore_inputs(get_artifact_dir(wildcards))


@ckptflow_config.one_line_errors
def get_restore_target(wildcards):
    """restore: the artifact of config iter, which must be on disk (restore refills it in place)."""
    run, name = get_target(False)
    return f"{REPORTS}/restore/{run}/{name}.json"


def get_all_restore_reports(wildcards):
    """A report per committed artifact with a receipt and a missing payload (of config run, else of
    every run), and every manifest in that scope: a target rule without inputs always runs, and
    `snakemake -n restore_all` says "Nothing to be done" once every artifact is local again.
    """
    scope = ckptflow_plan.restore_scope(RUNS, config["run"])
    reports = [
        f"{REPORTS}/restore/{run}/{it}.json" for run, it, pruned in scope if pruned
    ]
    return reports + [f"{artifact_dir(run, it)}/{MANIFEST}" for run, it, _ in scope]


# ------------------------------------------------------------------ scrub


def get_scrub_report(wildcards):
    """The scrub report of config scrub_subset: scrub/K-of-N.json, or scrub/all.json for every file."""
    return (
        f"{REPORTS}/scrub/{ckptflow_plan.scrub_slice_name(config['scrub_subset'])}.json"
    )


# ------------------------------------------------------------------ batches
# publish, verify and prune run in batch jobs (the rules <step>_batch), one process per batch runs the step of
# each of its artifacts (ckptflow.workflow_steps.batch_step), and the artifact's own rule, a local job,
# writes its report and log from the outcome, or fails alone (finish_member). A batch's members are the
# artifacts whose report is missing when Snakemake plans; they are written, with each one's rerun trigger
# and this planning's id, to a file named by their digest, which the batch job (planned again on the node)
# reads back. Every planning writes it again, so outcomes an earlier run left are never used: Snakemake
# runs the batch again (its member file is newer), and a member job runs its step itself when the
# outcomes it finds carry another planning's id. A job
# Snakemake reruns for another reason (a lost receipt, a restored payload, -R) reruns the batch its report
# names (its other members' outcomes go unused), or runs the step itself when there is none.
# Minutes of Slurm runtime per artifact of a batch (see the per-step runtimes in profiles/slurm).
BATCH_MINUTES = {"publish": 30, "verify": 30, "prune": 15}


def max_batches():
    """Batch jobs of one step worth running at once: --jobs under a cluster executor, else --cores."""
    nodes = workflow.resource_settings.nodes
    if (
        workflow.executor_plugin is not None
        and not workflow.executor_plugin.common_settings.non_local_exec
    ):
        nodes = None
    if not nodes or nodes >= 2**31:
        nodes = workflow.resource_settings.cores
    return max(1, int(nodes or 1))


def batch_member(step, run, it):
    """The rerun trigger the artifact's own rule gets (the batch records it with the artifact)."""
    wildcards = SimpleNamespace(run=run, iteration=it)
    if step == "publish":
        return {"run": run, "iteration": it, "publication": get_publication(wildcards)}
    if step == "prune":
        return {"run": run, "iteration": it, "round": get_prune_round(wildcards)}
    return {"run": run, "iteration": it}


@cache
def step_batches(step):
    """{(run, iteration): batch name} of the artifacts of ``step`` whose report is missing, their member
    files written under reports_dir/batches/<step>/."""
    if step == "publish":
        todo = [
            (run, it)
            for run, it in committed_artifacts()
            if not receipt_belongs(run, it)
            and not is_legacy(run, it)
            and not os.path.exists(publish_report(run, it))
        ]
    else:
        todo = [
            (run, it)
            for run, it in committed_artifacts()
            if not os.path.exists(f"{REPORTS}/{step}/{run}/{it}.json")
        ]
    index = {}
    for name, members in ckptflow_plan.batches(step, todo, max_batches()).items():
        ckptflow_plan.write_batch_members(
            batch_members_path(step, name),
            [batch_member(step, run, it) for run, it in members],
        )
        index.update({member: name for member in members})
    return index


def batch_members_path(step, name):
    return f"{REPORTS}/batches/{step}/{name}.members.json"


def batch_outcomes_path(step, name):
    return f"{REPORTS}/batches/{step}/{name}.json"


def get_member_batch(step):
    """Input function of a per-artifact rule: its batch's outcomes, or nothing outside a batch. Once the
    report exists, the batch its report names (while that batch's member file is there): the set of input
    files must stay what it was when the job ran, and a deleted temp() file alone reruns nothing.
    """

    def member_batch(wildcards):
        own_report = f"{REPORTS}/{step}/{wildcards.run}/{wildcards.iteration}.json"
        if os.path.exists(own_report):
            name = ckptflow_plan.report_batch(own_report)
            if (
                name is None
                or not os.path.exists(batch_members_path(step, name))
                or reruns_alone(step, wildcards, own_report)
            ):
                return []
        else:
            name = step_batches(step).get((wildcards.run, wildcards.iteration))
        return [] if name is None else [batch_outcomes_path(step, name)]

    return member_batch


def reruns_alone(step, wildcards, own_report):
    """True when the job of an artifact with a report reruns on a trigger of its own (a lost receipt, a
    restored payload, a newer publication): it runs its step itself rather than its old batch again.
    """
    if step == "publish":
        return not receipt_belongs(wildcards.run, wildcards.iteration)
    if step == "prune":
        return get_prune_round(wildcards) != ckptflow_plan.report_round(own_report)
    done = os.path.getmtime(own_report)
    return any(
        os.path.exists(f) and os.path.getmtime(f) > done
        for f in get_receipt_input(wildcards)
    )


def read_batch_members(step, name):
    return ckptflow_plan.read_batch_members(batch_members_path(step, name))


def get_batch_inputs(step):
    """Input function of a batch rule: its member file, and what each member's own rule takes as input."""

    def batch_inputs(wildcards):
        members = read_batch_members(step, wildcards.batch)
        inputs = []
        for m in members:
            w = SimpleNamespace(run=m["run"], iteration=m["iteration"])
            if step == "publish":
                inputs.append(f"{artifact_dir(m['run'], m['iteration'])}/{MANIFEST}")
            else:
                inputs.extend(get_receipt_input(w))
            if step == "prune":
                inputs.append(f"{REPORTS}/verify/{m['run']}/{m['iteration']}.json")
        return {"members": batch_members_path(step, wildcards.batch), "done": inputs}

    return batch_inputs


def get_batch_runtime(step):
    def batch_runtime(wildcards):
        return BATCH_MINUTES[step] * len(read_batch_members(step, wildcards.batch))

    return batch_runtime


def finish_member(step, wildcards, input, output, log, **triggers):
    """The body of a per-artifact rule (ckptflow.workflow_steps.finish_member)."""
    batch = list(input.batch) if hasattr(input, "batch") else []
    ckptflow_steps.member_job(
        ckptflow_steps.finish_member,
        step,
        wildcards.run,
        wildcards.iteration,
        batch[0] if batch else None,
        config,
        output.report,
        log[0],
        **triggers,
    )
