"""Snakemake shim for rule publish: log to the rule's log file, call ckptflow.workflow.publish_step."""

import logging
import sys

from ckptflow.workflow import publish_step

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with open(snakemake.log[0], "w", encoding="utf-8") as log:
    sys.stderr = log
    logging.basicConfig(stream=log, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p, config = snakemake.params, snakemake.config
    # Not params (see rules/publish.smk): where to publish is not part of a receipt's rerun identity.
    publish_step(p.artifact_dir, p.upload_prefix, config.get("bucket"), config.get("credentials"))
