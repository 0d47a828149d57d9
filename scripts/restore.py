"""Snakemake shim for rule restore_artifact: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.steps.restore_step."""

from ckptflow.workflow.steps import restore_step, step_log
from ckptflow.workflow.triggers import artifact_path

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    p, w = snakemake.params, snakemake.wildcards
    restore_step(artifact_path(snakemake.config["runs_root"], w.run, w.iteration), p.credentials, snakemake.output.report)
