"""Snakemake shim for rule status: the rule's log file gets its logs and any traceback; calls ckptflow.workflow.status_step."""

import sys
from pathlib import Path

from ckptflow.workflow import status_step, step_log

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with step_log(snakemake.log[0]):
    config, out = snakemake.config, snakemake.output
    status_step(config["runs_root"], config["reports_dir"], config["stage_dir"], config["teachers_dir"], out.json, out.txt)
sys.stdout.write(Path(out.txt).read_text(encoding="utf-8"))  # the table, on the terminal that ran snakemake
