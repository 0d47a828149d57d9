"""Snakemake shim for rule verify: log to the rule's log file, call ckptflow.workflow.verify_step."""

import logging
import sys

from ckptflow.workflow import verify_step

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with open(snakemake.log[0], "w", encoding="utf-8") as log:
    sys.stderr = log
    logging.basicConfig(stream=log, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = snakemake.params
    verify_step(p.artifact_dir, p.credentials, snakemake.output.report)
