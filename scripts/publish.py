"""Snakemake shim for rule publish: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.publish_step."""

from ckptflow.workflow import publish_step, step_log

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    p, config = snakemake.params, snakemake.config
    # Not params (see rules/publish.smk): where to publish is not part of a receipt's rerun identity.
    publish_step(p.artifact_dir, p.upload_prefix, config.get("bucket"), config.get("credentials"))
