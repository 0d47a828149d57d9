"""Snakemake shim for rules publish_batch, verify_batch and prune_batch: the batch's log file gets each artifact's logs, stderr the one-line error of an interrupted batch; calls ckptflow.workflow.batch_jobs.batch_step."""

from ckptflow.workflow.batch_jobs import batch_step
from ckptflow.workflow.steps import step_job

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_job(snakemake.log[0], snakemake.rule):
    batch_step(snakemake.rule.removesuffix("_batch"), snakemake.input.members, snakemake.config,
               snakemake.output.outcomes)
