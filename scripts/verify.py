"""Snakemake shim for rule verify: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.verify_step."""

from ckptflow.workflow import artifact_path, step_log, verify_step

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    p, w = snakemake.params, snakemake.wildcards
    verify_step(artifact_path(snakemake.config["runs_root"], w.run, w.iteration), p.credentials, snakemake.output.report)
