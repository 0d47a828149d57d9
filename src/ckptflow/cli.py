"""``ckptflow <verb>``: argument parsing, one JSON report on stdout, logs and progress on stderr.

Exit codes: 0 done; 1 refused or failed (one line on stderr naming the file and the remedy, and a JSON
report with ``status`` ``refused``/``failed`` on stdout); 2 usage error. ``CKPTFLOW_DEBUG=1`` adds the
traceback. Report keys are documented in ``schemas/report_<verb>.schema.json``; each verb lives in
``commands/<verb>.py``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import traceback
from typing import Any

from . import __version__
from .commands import ReportedFailure
from .errors import CkptflowError, ConflictError, Refused, UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# Order is the order of `ckptflow --help`.
VERBS = ["seal", "merge", "publish", "verify", "prune-verified", "fetch", "materialize", "probe", "status"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        self.print_usage(sys.stderr)
        sys.stderr.write(f"ckptflow: error: {message}\n")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ckptflow", description="Safe life-cycle management for post-training checkpoint artifacts.")
    p.add_argument("--version", action="version", version=f"ckptflow {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level on stderr")
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_Parser)
    for verb in VERBS:
        importlib.import_module(f"ckptflow.commands.{verb.replace('-', '_')}").register(sub)
    return p


def _emit(report: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(report, sort_keys=True, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _error_report(status: str, exc: BaseException) -> dict[str, Any]:
    return {"status": status, "error": {"type": type(exc).__name__, "message": str(exc)}}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="ckptflow: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    debug = os.environ.get("CKPTFLOW_DEBUG") == "1"
    try:
        report = args.func(args)
    except ReportedFailure as exc:
        _emit(exc.report)
        sys.stderr.write(f"ckptflow {args.verb}: {exc.line}\n")
        return EXIT_FAILED
    except UsageError as exc:
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"ckptflow {args.verb}: usage error: {exc}\n")
        _emit(_error_report("usage-error", exc))
        return EXIT_USAGE
    except CkptflowError as exc:
        if debug:
            traceback.print_exc()
        status = "refused" if isinstance(exc, Refused | ConflictError) else "failed"
        sys.stderr.write(f"ckptflow {args.verb}: {status}: {exc}\n")
        _emit(_error_report(status, exc))
        return EXIT_FAILED
    except OSError as exc:  # disk full, permission denied …: name the file, no traceback
        if debug:
            traceback.print_exc()
        sys.stderr.write(f"ckptflow {args.verb}: failed: {exc}\n")
        _emit(_error_report("failed", exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write(f"ckptflow {args.verb}: interrupted; rerun the same command to continue\n")
        return 130
    _emit(report)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
