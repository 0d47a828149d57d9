"""Snakemake shim for rule prune: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.prune_step."""

from ckptflow.workflow import artifact_of, prune_step, step_log

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    p = snakemake.params
    prune_step(artifact_of(snakemake.input.receipt), p.credentials, snakemake.output.report)
