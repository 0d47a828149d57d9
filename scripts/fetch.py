"""Snakemake shim for rule fetch: log to the rule's log file, call ckptflow.workflow.fetch_step."""

import logging
import sys

from ckptflow.workflow import fetch_step

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with open(snakemake.log[0], "w", encoding="utf-8") as log:
    sys.stderr = log
    logging.basicConfig(stream=log, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = snakemake.params
    # Not params (see rules/fetch.smk): which credentials reach the archive is not part of the request.
    fetch_step(p.artifact_uri, p.stage_root, snakemake.config.get("credentials"), snakemake.output.report)
