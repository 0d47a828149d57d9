"""One module per CLI verb. Each defines ``register(subparsers)``, which adds its parser and sets
``func`` to a function taking the parsed namespace and returning the JSON report (a dict).

A verb raises ``errors.CkptflowError`` subclasses for refusals and failures, or ``ReportedFailure``
when it has a full report but must still exit 1. ``cli.py`` owns output and exit codes. Stores are
opened by ``store.open`` from the raw ``--bucket``/``--credentials`` values.

A verb that needs an optional dependency group calls ``require_extra`` first: the core install
(``pip install /path/to/ckptflow``, no extra) has no torch, transformers or snakemake, and such a verb then exits 2 with
one line naming the extra to install instead of an ImportError traceback.
"""

from .common import EXTRAS, ReportedFailure, extra_of, missing_extra, require_extra, wait_seconds_arg

__all__ = ["EXTRAS", "ReportedFailure", "extra_of", "missing_extra", "require_extra", "wait_seconds_arg"]
