"""Snakemake shim for rule prune: the rule's log file gets its logs and any traceback, stderr the one-line error; calls ckptflow.workflow.steps.prune_step."""

from ckptflow.workflow.steps import prune_step, step_job
from ckptflow.workflow.triggers import artifact_path

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_job(snakemake.log[0], snakemake.rule):
    p, w = snakemake.params, snakemake.wildcards
    prune_step(artifact_path(snakemake.config["runs_root"], w.run, w.iteration), p.credentials, snakemake.output.report,
               round=p.round)
