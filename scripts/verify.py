"""Snakemake shim for rule verify: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.verify_step."""

from ckptflow.workflow import artifact_of, step_log, verify_step

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    p = snakemake.params
    verify_step(artifact_of(snakemake.input[0]), p.credentials, snakemake.output.report)
