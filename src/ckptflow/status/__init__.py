"""``ckptflow status``: one row per (run, iteration), read from the records alone.

Where each column comes from (per artifact one directory listing, a stat of each payload file and a few
small record reads; per stage and teacher a stat of each file its record names). Nothing is hashed but a
payload file modified after its manifest's commit (``artifact.changed_payloads``): an in-place rewrite
shows as ``damaged``, a copy that kept no times costs one read of that file::

    <root>/<run>/checkpoint_artifacts/iter_N/     run = <project>/<group>/<run>/<ts>
        .posttrain-checkpoint-artifact.json       local: committed (a directory without it: incomplete)
        .merge-complete.json                      merged: the request's mode and number of experts
        .merge-in-progress.json                   merged: in progress (without .merge-complete.json: local incomplete)
        .uploaded                                 published: receipt, foreign (written for another
                                                  artifact: records.receipt.check_belongs), or legacy
        the manifest's payload files              pruned (gone while a receipt is kept), partial; local
                                                  damaged when one has another size or was
                                                  rewritten after the commit; local size
    <reports_dir>/verify/<run>/iter_N.json        verified: the latest verify report and its time
    <reports_dir>/prune/<run>/iter_N.json         pruned: why a prune kept the payloads
    <stage_dir>/<run>/iter_N/.staged.json         staged (a subset: "staged (model only)"); partial /
                                                  damaged when a file it names is gone / has another size
    <teachers_dir>/<run>/iter_N/.materialized     materialized: teacher path and source; partial /
                                                  damaged likewise for its shards

``root`` is a runs root (every directory below it that holds ``checkpoint_artifacts/`` is a run, named
by its path relative to the root) or one run directory (named by its last four path components, the
``<project>/<group>/<run>/<ts>`` that the staging, teacher and report trees use). Rows also come from
those trees alone: an iteration staged or materialized from the archive with no local directory shows
``local`` ``absent``.

The store is contacted only when ``verify_with`` is given (``--verify``): each ``.uploaded`` is then
checked live by ``archive.verify.verify_artifact``. A record that cannot be read shows ``corrupt`` in its
own cell with the reason as ``detail``; it never stops the table.
"""

from .collect import collect_status
from .render import human_bytes, render_report
from .report import COLUMNS, Row, StatusReport

__all__ = ["COLUMNS", "Row", "StatusReport", "collect_status", "human_bytes", "render_report"]
