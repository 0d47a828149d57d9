"""One module per CLI verb. Each defines ``register(subparsers)``, which adds its parser and sets
``func`` to a function taking the parsed namespace and returning the JSON report (a dict).

A verb raises ``errors.CkptflowError`` subclasses for refusals and failures, or ``ReportedFailure``
when it has a full report but must still exit 1. ``cli.py`` owns output and exit codes. Stores are
opened by ``store.open`` from the raw ``--bucket``/``--credentials`` values.
"""

from __future__ import annotations

from typing import Any


class ReportedFailure(Exception):
    """A verb that produced a full report but must exit 1 (for example a failed probe)."""

    def __init__(self, report: dict[str, Any], line: str):
        super().__init__(line)
        self.report = report
        self.line = line
