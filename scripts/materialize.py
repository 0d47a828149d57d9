"""Snakemake shim for rule materialize: log to the rule's log file, call ckptflow.workflow.materialize_step."""

import logging
import sys

from ckptflow.workflow import materialize_step

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with open(snakemake.log[0], "w", encoding="utf-8") as log:
    sys.stderr = log
    logging.basicConfig(stream=log, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p = snakemake.params
    materialize_step(p.base, p.out, p.ckpt_dir, p.options, snakemake.output.report)
