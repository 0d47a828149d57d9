"""Snakemake shim for rule scrub: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.steps.scrub_step."""

from ckptflow.workflow.steps import scrub_step, step_log

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    scrub_step(snakemake.config["runs_root"], snakemake.params.credentials, snakemake.wildcards.slice,
               snakemake.output.report)
