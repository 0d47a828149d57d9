"""Snakemake shim for rule publish: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.publish_step."""

from ckptflow.workflow import artifact_of, publish_step, step_log, upload_prefix

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    config = snakemake.config
    # Not params (see rules/publish.smk): where to publish is not part of a receipt's rerun identity.
    publish_step(artifact_of(snakemake.input.manifest), upload_prefix(snakemake.wildcards.run), config.get("bucket"),
                 config.get("credentials"))
