"""Snakemake shim for rule prune: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.prune_step."""

from ckptflow.workflow import artifact_path, prune_step, step_log

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    p, w = snakemake.params, snakemake.wildcards
    prune_step(artifact_path(snakemake.config["runs_root"], w.run, w.iteration), p.credentials, snakemake.output.report)
