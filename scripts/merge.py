"""Snakemake shim for rule merge: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.merge_step."""

from ckptflow.workflow import merge_step, step_log

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    p = snakemake.params
    merge_step(p.artifact_dir, p.recipe, p.iteration, snakemake.output.report)
