"""Snakemake shim for rule replace_legacy_receipt: the rule's log file gets its logs and any traceback, stderr the one-line error; calls ckptflow.workflow.steps.replace_legacy_receipt_step."""

from ckptflow.workflow.steps import replace_legacy_receipt_step, step_job
from ckptflow.workflow.triggers import artifact_of, step_reports, upload_prefix

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_job(snakemake.log[0], snakemake.rule):
    config, w = snakemake.config, snakemake.wildcards
    # Not params, as for rule publish: where to publish is not part of the rerun identity.
    artifact = artifact_of(snakemake.input.manifest)
    replace_legacy_receipt_step(artifact, upload_prefix(artifact, w.run), config.get("bucket"),
                                config.get("credentials"), snakemake.output.report,
                                named_by=step_reports(config["reports_dir"], w.run, w.iteration))
