"""Snakemake shim for rule publish: the rule's log file gets its logs and any traceback, stderr the one-line error; calls ckptflow.workflow.steps.publish_step."""

from ckptflow.workflow.steps import publish_step, step_job
from ckptflow.workflow.triggers import artifact_path, step_reports, upload_prefix

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_job(snakemake.log[0], snakemake.rule):
    config, w = snakemake.config, snakemake.wildcards
    # Not params (see rules/publish.smk): where to publish is not part of the rerun identity.
    artifact = artifact_path(config["runs_root"], w.run, w.iteration)
    publish_step(artifact, upload_prefix(artifact, w.run), config.get("bucket"), config.get("credentials"),
                 snakemake.output.report, publication=snakemake.params.publication,
                 named_by=step_reports(config["reports_dir"], w.run, w.iteration))
