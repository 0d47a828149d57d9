"""Snakemake shim for rule merge: log to the rule's log file, call ckptflow.workflow.merge_step."""

import logging
import sys

from ckptflow.workflow import merge_step

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with open(snakemake.log[0], "w", encoding="utf-8") as log:
    sys.stderr = log
    logging.basicConfig(stream=log, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = snakemake.params
    merge_step(p.artifact_dir, p.recipe, p.iteration, snakemake.output.report)
