"""Snakemake shim for rule prune_keep_free: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.steps.keep_free_step."""

from ckptflow.workflow.steps import keep_free_step, step_log

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    p = snakemake.params
    keep_free_step(snakemake.config["runs_root"], p.keep_free, p.keep_newest, p.credentials, snakemake.output.report,
                   round=p.round)
