import sys

from snakemake.utils import validate

from ckptflow.errors import CkptflowError
from ckptflow.records.manifest import FILENAME as MANIFEST
from ckptflow.workflow import config as ckptflow_config
from ckptflow.workflow.batch_jobs import member_rule
from ckptflow.workflow.config import one_line_errors
from ckptflow.workflow.plan import Plan, max_batches

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

# The input functions' logic is ckptflow.workflow.plan; what only Snakemake knows comes in as callables: the
# targets it parsed (once planning started), how many batch jobs run at once, whether it executes.
PLAN = Plan(
    config,
    targets=lambda: (
        workflow.dag_settings.targets if workflow.dag_settings is not None else ()
    ),
    max_batches=lambda: max_batches(workflow),
    executing=lambda: workflow.executor_plugin is not None,
)
RUNS, REPORTS, LOGS = PLAN.runs, PLAN.reports, PLAN.logs
ARTIFACT = PLAN.artifact_dir("{run}", "{iteration}")


wildcard_constraints:
    iteration=r"iter_[0-9]+",


def each(method, *args):
    """An input function of a per-artifact rule: ``method`` of the plan on its run and iteration."""
    return lambda w: method(*args, w.run, w.iteration)


def once(method, *args):
    """An input function of a target rule: ``method`` of the plan, whatever the wildcards."""
    return lambda w: method(*args)


def of_batch(method, step):
    """An input function of a batch rule: ``method`` of the plan on the step and the batch's name."""
    return lambda w: method(step, w.batch)


# publish, verify, prune (see ckptflow.workflow.plan, batches)
get_publish_all_input = one_line_errors(once(PLAN.publish_all_input))
get_receipt_input = one_line_errors(each(PLAN.receipt_input))
get_publication = one_line_errors(each(PLAN.publication))
get_all_verify_reports = one_line_errors(once(PLAN.all_reports, "verify"))
get_prune_round = each(PLAN.prune_round)
get_keep_free_round = once(PLAN.keep_free_round)
get_prune_all_input = one_line_errors(once(PLAN.prune_all_input))
get_member_batch = lambda step: one_line_errors(each(PLAN.member_batch, step))
get_batch_inputs = lambda step: of_batch(PLAN.batch_inputs, step)
get_batch_runtime = lambda step: of_batch(PLAN.batch_runtime, step)

# iteration-scoped targets: merge, materialize, fetch
get_merge_target = one_line_errors(once(PLAN.merge_target))
get_teacher_target = one_line_errors(once(PLAN.teacher_target))
iteration_of = lambda w: ckptflow_config.parse_iteration(w.iteration)
get_artifact_dir = each(PLAN.artifact_dir)
get_merge_recipe = one_line_errors(lambda w: PLAN.merge_recipe(w.iteration))
get_merge_experts = one_line_errors(lambda w: PLAN.merge_experts(w.iteration))
get_teacher_input = one_line_errors(each(PLAN.teacher_input))
get_teacher_ckpt_dir = one_line_errors(each(PLAN.teacher_ckpt_dir))
get_teacher_uri = one_line_errors(each(PLAN.teacher_uri))
get_fetch_uri = one_line_errors(each(PLAN.fetch_uri))
get_fetch_receipt_dir = one_line_errors(each(PLAN.fetch_receipt_dir))
get_stage_root = lambda w: PLAN.stage_root(w.run)
get_teacher_out = each(PLAN.teacher_out)

# status: the rule's rerun trigger, and the table shown while planning (Plan.records_fingerprint)
get_records_fingerprint = one_line_errors(
    lambda w: PLAN.records_fingerprint(
        rules.status.output.json, rules.status.output.txt
    )
)

# restore, scrub
get_restore_input = each(PLAN.restore_input)
get_restore_target = one_line_errors(once(PLAN.restore_target))
get_all_restore_reports = once(PLAN.all_restore_reports)
get_scrub_report = once(PLAN.scrub_report)
