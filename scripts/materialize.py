"""Snakemake shim for rule materialize: the rule's log file gets its logs and any traceback, stderr the one-line error; calls ckptflow.workflow.steps.materialize_step."""

from ckptflow.workflow.steps import materialize_step, step_job

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_job(snakemake.log[0], snakemake.rule):
    p = snakemake.params
    # Credentials are read from the config (see rules/fetch.smk): where the keys live is not the request.
    materialize_step(p.base, p.out, p.ckpt_dir, p.artifact_uri, p.stage_root, snakemake.config.get("credentials"),
                     p.options, snakemake.output.report)
