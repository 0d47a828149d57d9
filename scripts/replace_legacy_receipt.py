"""Snakemake shim for rule replace_legacy_receipt: log to the rule's log file, call ckptflow.workflow.replace_legacy_receipt_step."""

import logging
import sys

from ckptflow.workflow import replace_legacy_receipt_step

snakemake = globals()["snakemake"]  # injected by Snakemake's script directive
with open(snakemake.log[0], "w", encoding="utf-8") as log:
    sys.stderr = log
    logging.basicConfig(stream=log, level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    p, config = snakemake.params, snakemake.config
    # Not params, as for rule publish: where to publish is not part of the rerun identity.
    replace_legacy_receipt_step(p.artifact_dir, p.upload_prefix, config.get("bucket"), config.get("credentials"),
                                snakemake.output.report)
