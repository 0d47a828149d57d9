"""Snakemake shim for rule status: log to the rule's log file, call ckptflow.workflow.status_step."""

import logging
import sys
from pathlib import Path

from ckptflow.workflow import status_step

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with open(snakemake.log[0], "w", encoding="utf-8") as log:
    sys.stderr = log
    logging.basicConfig(stream=log, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    config, out = snakemake.config, snakemake.output
    status_step(config["runs_root"], config["reports_dir"], config["stage_dir"], config["teachers_dir"], out.json, out.txt)
sys.stdout.write(Path(out.txt).read_text(encoding="utf-8"))  # the table, on the terminal that ran snakemake
