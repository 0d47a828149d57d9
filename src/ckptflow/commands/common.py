"""What the verbs share: the optional-extra check (``require_extra``), the failure that still has a
report (``ReportedFailure``) and argument parsers used by several verbs (``wait_seconds_arg``)."""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
from typing import Any

from ..errors import MissingExtra

# The import names each extra of pyproject.toml provides, and the package names where they differ.
EXTRAS: dict[str, tuple[str, ...]] = {
    "convert": ("torch", "transformers", "safetensors", "tokenizers", "PIL"),
    "workflow": ("snakemake",),
}
_PACKAGE = {"PIL": "pillow"}


def _installed(module: str) -> bool:
    if module in sys.modules:  # None there means the import is blocked
        return sys.modules[module] is not None
    return importlib.util.find_spec(module) is not None


def require_extra(verb: str, extra: str) -> None:
    """Raise ``MissingExtra`` unless every module of ``extra`` can be imported (nothing is imported)."""
    missing = [m for m in EXTRAS[extra] if not _installed(m)]
    if missing:
        raise missing_extra(verb, extra, missing)


def extra_of(module: str | None) -> str | None:
    """The extra that provides top-level module ``module`` (``torch.nn`` → ``convert``), or None."""
    top = (module or "").partition(".")[0]
    return next((extra for extra, names in EXTRAS.items() if top in names), None)


def missing_extra(verb: str, extra: str, missing: list[str]) -> MissingExtra:
    missing = [_PACKAGE.get(m, m) for m in missing]
    return MissingExtra(
        f"{verb} needs the optional dependencies of ckptflow[{extra}] and {', '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} not installed",
        remedy=f"install them with: pip install 'ckptflow[{extra}]'",
    )


class ReportedFailure(Exception):
    """A verb that produced a full report but must exit 1 (for example a failed probe)."""

    def __init__(self, report: dict[str, Any], line: str):
        super().__init__(line)
        self.report = report
        self.line = line


def wait_seconds_arg(text: str) -> float:
    """``--lock-wait-seconds`` of every verb that takes a lock: a finite number >= 0; anything else is a
    usage error (exit 2)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds >= 0 (inf and nan are refused)")
    return value
