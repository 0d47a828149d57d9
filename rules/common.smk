import os
import sys
from functools import cache

from snakemake.utils import validate

from ckptflow import workflow as ckptflow_workflow
from ckptflow.errors import UsageError
from ckptflow.records.receipt import belonging_receipt, is_legacy_receipt

# --config iter=300 arrives as an int, nested overrides as strings: type them before validating.
config.update(ckptflow_workflow.normalise_config(config))


validate(config, schema="../schemas/config.schema.json")

RUNS = config["runs_root"].rstrip("/")
REPORTS = config["reports_dir"].rstrip("/")
LOGS = config["logs_dir"].rstrip("/")
STAGE = config["stage_dir"].rstrip("/")
TEACHERS = config["teachers_dir"].rstrip("/")
ARTIFACT = f"{RUNS}/{{run}}/checkpoint_artifacts/{{iteration}}"
MANIFEST = ".posttrain-checkpoint-artifact.json"


wildcard_constraints:
    iteration=r"iter_[0-9]+",


def committed_artifacts():
    """(run, iteration) of every artifact whose native manifest is committed: the runs `ckptflow status`
    shows, found without walking into a run's checkpoints (one listing per directory above the runs).
    """
    return ckptflow_workflow.committed_artifacts(RUNS)


def is_legacy(run, iteration):
    """True when the artifact's .uploaded is a legacy plain-text marker: it proves nothing."""
    return is_legacy_receipt(f"{RUNS}/{run}/checkpoint_artifacts/{iteration}")


@cache
def receipt_belongs(run, iteration):
    """True when the artifact holds a receipt that is its own (read once per planning)."""
    return (
        belonging_receipt(f"{RUNS}/{run}/checkpoint_artifacts/{iteration}") is not None
    )


def publish_report(run, iteration):
    return f"{REPORTS}/publish/{run}/{iteration}.json"


def get_pending_publications(wildcards):
    """The pending publications: a report per committed artifact without a receipt that belongs to it
    (missing, legacy, full-checkpoint, another artifact's); a legacy marker is replaced by publication.
    """
    return [
        (
            f"{REPORTS}/legacy-receipt/{run}/{it}.json"
            if is_legacy(run, it)
            else publish_report(run, it)
        )
        for run, it in committed_artifacts()
        if not receipt_belongs(run, it)
    ]


def get_publish_all_input(wildcards):
    """The pending publications, and the manifest of every committed artifact: a target rule without
    inputs always runs, and `snakemake -n publish_all` says "Nothing to be done" when nothing is pending.
    """
    manifests = [
        f"{RUNS}/{run}/checkpoint_artifacts/{it}/{MANIFEST}"
        for run, it in committed_artifacts()
    ]
    return get_pending_publications(wildcards) + manifests


def get_receipt_input(wildcards):
    """What verify and prune take for the receipt. The set of files must not change when a publication
    completes (a changed set of inputs reruns a job): the publish report once it exists or while the
    receipt is pending, the receipt itself for an artifact published outside the workflow, and for a
    legacy marker (or one replaced before) the marker with the publication that replaces it.
    """
    run, it = wildcards.run, wildcards.iteration
    receipt = f"{RUNS}/{run}/checkpoint_artifacts/{it}/.uploaded"
    replaced = f"{REPORTS}/legacy-receipt/{run}/{it}.json"
    if is_legacy(run, it) or (os.path.exists(replaced) and receipt_belongs(run, it)):
        return [receipt, replaced]
    if os.path.exists(publish_report(run, it)) or not receipt_belongs(run, it):
        return [publish_report(run, it)]
    return [receipt]


def get_publication(wildcards):
    """The publish job's rerun trigger (see rules/publish.smk)."""
    return ckptflow_workflow.publication_number(
        get_artifact_dir(wildcards),
        publish_report(wildcards.run, wildcards.iteration),
    )


def get_all_verify_reports(wildcards):
    return [f"{REPORTS}/verify/{run}/{it}.json" for run, it in committed_artifacts()]


def get_all_prune_reports(wildcards):
    return [f"{REPORTS}/prune/{run}/{it}.json" for run, it in committed_artifacts()]


def get_prune_all_input(wildcards):
    """Every artifact's prune report, or with config prune.keep_free the one keep-free report."""
    if ckptflow_workflow.keep_free_target(config) is None:
        return get_all_prune_reports(wildcards)
    return [f"{REPORTS}/prune/keep-free.json"]


# ------------------------------------------------------------------ iteration-scoped targets


def get_iteration():
    """config iter, required by merge_experts and materialize_teacher."""
    if config["iter"] is None:
        raise UsageError(
            "this target acts on one iteration and config iter is not set",
            remedy="pass --config iter=300",
        )
    return config["iter"]


@cache
def get_target():
    """(run, iter_N) of config iter: config run, else the one run holding it."""
    return ckptflow_workflow.resolve_run(RUNS, get_iteration(), config["run"])


def get_merge_target(wildcards):
    run, name = get_target()
    if ckptflow_workflow.merge_recipe(config, get_iteration()) is None:
        raise UsageError(
            f"config merge has no recipe for iteration {get_iteration()}",
            remedy="add one under merge: in config/config.yaml (see config/README.md)",
        )
    return f"{REPORTS}/merge/{run}/{name}.json"


def get_teacher_target(wildcards):
    run, name = get_target()
    return f"{REPORTS}/materialize/{run}/{name}.json"


def iteration_of(wildcards):
    return ckptflow_workflow.parse_iteration(wildcards.iteration)


def get_artifact_dir(wildcards):
    return f"{RUNS}/{wildcards.run}/checkpoint_artifacts/{wildcards.iteration}"


def get_merge_recipe(wildcards):
    """The recipe of the iteration, a tv merge without its own base on the top-level base."""
    recipe = ckptflow_workflow.merge_recipe(config, iteration_of(wildcards))
    if recipe is None:
        raise UsageError(
            f"config merge has no recipe for iteration {iteration_of(wildcards)}",
            remedy="add one under merge: in config/config.yaml",
        )
    if recipe["mode"] == "tv" and not recipe.get("base"):
        return {**recipe, "base": config["base"]}
    return recipe


def get_merge_experts(wildcards):
    return list(get_merge_recipe(wildcards)["experts"])


@cache
def teacher_source(run, iteration):
    return ckptflow_workflow.teacher_source(
        f"{RUNS}/{run}/checkpoint_artifacts/{iteration}",
        run,
        bucket=config["bucket"],
        has_recipe=ckptflow_workflow.merge_recipe(
            config, ckptflow_workflow.parse_iteration(iteration)
        )
        is not None,
    )


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


def get_teacher_ckpt_dir(wildcards):
    """The local artifact materialize reads in place; None when it builds from the archive."""
    source = teacher_source(wildcards.run, wildcards.iteration)
    return None if source.kind == "archive" else str(source.artifact_dir)


def get_teacher_uri(wildcards):
    """The archive materialize builds from (fetched into the fetch rule's stage when a build needs it), so
    the teacher records the archive's identity; None when the local artifact is used in place.
    """
    source = teacher_source(wildcards.run, wildcards.iteration)
    return source.uri if source.kind == "archive" else None


def get_fetch_uri(wildcards):
    """The archive of the artifact: named by its receipt, or under the bucket when there is no local copy."""
    source = teacher_source(wildcards.run, wildcards.iteration)
    if source.uri is None:
        raise UsageError(
            f"{source.artifact_dir} is used in place ({source.why}); nothing to fetch",
            remedy="target materialize_teacher; it fetches only when the payload is gone",
        )
    return source.uri


def get_stage_root(wildcards):
    return f"{STAGE}/{wildcards.run}"


def get_teacher_out(wildcards):
    return f"{TEACHERS}/{wildcards.run}/{wildcards.iteration}"


def get_records_fingerprint(wildcards):
    """The status rule's rerun trigger: it reruns when what status would print changed (a record, or a
    file a record names gone or resized). `--report` runs no job, so it refuses a table that is out of
    date instead of embedding it.
    """
    current = ckptflow_workflow.records_fingerprint(RUNS, REPORTS, STAGE, TEACHERS)
    if "--report" in sys.argv and os.path.exists(f"{REPORTS}/status.json"):
        recorded = workflow.persistence.params(rules.status.output.json) or []
        if not any(current in str(value) for value in recorded):
            raise UsageError(
                f"{REPORTS}/status.json is out of date: a record, or a file a record names, "
                "changed since the status table was written",
                remedy="run `snakemake` (the status table) first, then `snakemake --report`",
            )
    return current


# ------------------------------------------------------------------ restore


def get_restore_input(wildcards):
    """The artifact directory (and a directory that lost a payload): its mtime is the rerun trigger."""
    return ckptflow_workflow.restore_inputs(get_artifact_dir(wildcards))


def get_restore_target(wildcards):
    run, name = get_target()
    return f"{REPORTS}/restore/{run}/{name}.json"


def get_all_restore_reports(wildcards):
    """A report per committed artifact with a receipt and a missing payload (of config run, else of
    every run), and every manifest in that scope: a target rule without inputs always runs, and
    `snakemake -n restore_all` says "Nothing to be done" once every artifact is local again.
    """
    scope = ckptflow_workflow.restore_scope(RUNS, config["run"])
    reports = [
        f"{REPORTS}/restore/{run}/{it}.json" for run, it, pruned in scope if pruned
    ]
    return reports + [
        f"{RUNS}/{run}/checkpoint_artifacts/{it}/{MANIFEST}" for run, it, _ in scope
    ]


# ------------------------------------------------------------------ scrub


def get_scrub_report(wildcards):
    """The scrub report of config scrub_subset: scrub/K-of-N.json, or scrub/all.json for every file."""
    return f"{REPORTS}/scrub/{ckptflow_workflow.scrub_slice_name(config['scrub_subset'])}.json"
