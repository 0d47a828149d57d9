"""Snakemake shim for rule merge: the rule's log file gets its logs and any traceback, stderr the one-line error; calls ckptflow.workflow.steps.merge_step."""

from ckptflow.workflow.steps import merge_step, step_job

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_job(snakemake.log[0], snakemake.rule):
    p = snakemake.params
    merge_step(p.artifact_dir, p.recipe, p.iteration, snakemake.output.report)
