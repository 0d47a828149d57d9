"""Snakemake shim for rule status: the rule's log file gets its logs and any traceback, stderr the one-line error; calls ckptflow.workflow.steps.status_step."""

from ckptflow.workflow.steps import status_step, step_job

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_job(snakemake.log[0], snakemake.rule):
    config, out = snakemake.config, snakemake.output
    status_step(config["runs_root"], config["reports_dir"], config["stage_dir"], config["teachers_dir"], out.json, out.txt)
# The table reaches the terminal while Snakemake plans (ckptflow.workflow.plan.Plan.records_fingerprint), also when this job does not run.
