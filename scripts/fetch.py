"""Snakemake shim for rule fetch: the rule's log file gets its logs and any traceback, stderr the one-line error; calls ckptflow.workflow.steps.fetch_step."""

from ckptflow.workflow.steps import fetch_step, step_job

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_job(snakemake.log[0], snakemake.rule):
    p = snakemake.params
    # Not params (see rules/fetch.smk): which credentials reach the archive is not part of the request.
    fetch_step(p.artifact_uri, p.stage_root, snakemake.config.get("credentials"), snakemake.output.report,
               receipt_dir=p.receipt_dir)
