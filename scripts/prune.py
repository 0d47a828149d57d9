"""Snakemake shim for rule prune: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.prune_step."""

from ckptflow.workflow import prune_step, step_log

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    p = snakemake.params
    prune_step(p.artifact_dir, p.credentials, snakemake.output.report)
