"""Snakemake shim for rules publish_batch, verify_batch and prune_batch: the batch's log file gets each artifact's logs, stderr the one-line error of an interrupted batch; calls ckptflow.workflow_steps.batch_step."""

from ckptflow.workflow_steps import batch_step, step_job

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_job(snakemake.log[0], snakemake.rule):
    batch_step(snakemake.rule.removesuffix("_batch"), snakemake.input.members, snakemake.config,
               snakemake.output.outcomes)
