"""``ckptflow <verb>``: argument parsing, one JSON report on stdout, logs and progress on stderr.

When stdout is a terminal (and ``--json`` is not given) the report is replaced by a short human summary:
the verb module's ``summarize(report, elapsed)``, or ``commands.summary.generic`` (see
``commands/summary.py``); a refusal is then its one stderr line, repeated on stdout only when stderr goes
elsewhere, and a failure with a full report (verify, resume-check, prune-verified) is its summary, with
its stderr line left out when stderr is the same terminal (each message is shown once). Exit codes: 0 done; 1 refused or failed (one line on stderr naming the file and the remedy, and a JSON
report with ``status`` ``refused``/``failed`` on stdout); 2 usage error, or a verb whose optional
dependencies (``ckptflow[convert]``) are not installed. ``CKPTFLOW_DEBUG=1`` adds the
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
import time
import traceback
from typing import Any

from . import __version__
from .commands import ReportedFailure, extra_of, missing_extra, summary
from .errors import CkptflowError, ConflictError, MissingExtra, OutOfSpace, Refused, UsageError

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

# Order is the order of `ckptflow --help`.
VERBS = ["seal", "merge", "publish", "verify", "prune-verified", "restore", "repair-part-digests", "fetch", "materialize",
         "probe", "status", "ls", "resume-check", "retain-checkpoints", "gc-uploads"]


class _ArgumentError(SystemExit):
    """An argument error argparse found (exit 2); ``main`` adds its JSON report before it propagates."""

    def __init__(self, message: str):
        super().__init__(EXIT_USAGE)
        self.message = message


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        """The parser's usage and one line named after it (``ckptflow publish: error: ...`` for a verb's)."""
        self.print_usage(sys.stderr)
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise _ArgumentError(message)


class _VerbParser(_Parser):
    """A verb's parser: an argument it does not know is its own error (``ckptflow verify: error:
    unrecognized arguments`` under the verb's usage). argparse's subparsers hand unknown arguments up
    to the top-level parser, which would name ``ckptflow`` and print the list of verbs instead."""

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="ckptflow", description="Safe life-cycle management for post-training checkpoint artifacts.")
    p.add_argument("--version", action="version", version=f"ckptflow {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help=_VERBOSE_HELP)
    p.add_argument("--json", dest="json_global", action="store_true", help=_JSON_HELP)
    sub = p.add_subparsers(dest="verb", required=True, parser_class=_VerbParser)
    for verb in VERBS:
        importlib.import_module(f"ckptflow.commands.{verb.replace('-', '_')}").register(sub)
    for verb in VERBS:  # after the verb too; a verb that declares its own --json or -v keeps it
        for flags, kwargs in ((("--json",), {"help": _JSON_HELP}),
                              (("-v", "--verbose"), {"dest": "verbose_verb", "help": _VERBOSE_HELP})):
            try:
                sub.choices[verb].add_argument(*flags, action="store_true", **kwargs)
            except argparse.ArgumentError:
                pass
    return p


_VERBOSE_HELP = "log the step at INFO level on stderr (endpoints, checksum modes, retries)"
_JSON_HELP = "print the JSON report on a terminal too (when stdout is not a terminal it always is JSON)"


def _emit(report: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(report, sort_keys=True, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or replaced stream
        return False


def _same_file(a, b) -> bool:
    try:
        return os.path.samestat(os.fstat(a.fileno()), os.fstat(b.fileno()))
    except (AttributeError, OSError, ValueError):
        return False


class _Output:
    """Where a report goes: the JSON report (stdout not a terminal, or --json), else a human summary."""

    def __init__(self, verb: str, as_json: bool, args: argparse.Namespace | None = None):
        self.verb, self.as_json, self.args = verb, as_json, args

    def report(self, report: dict[str, Any], elapsed: float) -> None:
        report = _with_credentials(report)
        if self.as_json:
            return _emit(report)
        try:
            text = summary.render(self.verb, report, elapsed, self.args)
        except Exception as exc:  # noqa: BLE001 - the work is done: a summary bug must not change the outcome
            logging.getLogger("ckptflow").warning("no summary for this report (%s: %s)", type(exc).__name__, exc)
            text = summary.generic(report, elapsed)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def error(self, report: dict[str, Any], line: str) -> None:
        """A refusal, failure or usage error: the JSON report, or on a terminal its one stderr line
        (already written there), repeated on stdout only when stderr is not the same terminal."""
        report = _with_credentials(report)
        if self.as_json:
            return _emit(report)
        if not _same_file(sys.stdout, sys.stderr):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def _with_credentials(report: dict[str, Any]) -> dict[str, Any]:
    """Every report, errors included, names where the command's credentials came from (never a key):
    ``{"source": "file"|"env:CKPTFLOW_CREDENTIALS", "path"}``, ``{"source": "aws-chain", "method"}``, or
    null when it read none (no store opened, or only ``file://`` ones)."""
    from .store.open import credentials_used  # here, not at the top: `ckptflow --help` stays light

    used = credentials_used()
    return {**report, "credentials": used.as_dict() if used is not None else None}


def _forget_credentials_used() -> None:
    opened = sys.modules.get("ckptflow.store.open")  # never imported: nothing was noted
    if opened is not None:
        opened.forget_credentials_used()


def _error_report(status: str, exc: BaseException) -> dict[str, Any]:
    error: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    if isinstance(exc, OutOfSpace):  # a full disk: how much to free, and where
        error.update(path=exc.path, needed_bytes=exc.needed, free_bytes=exc.free)
    return {"status": status, "error": error}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except _ArgumentError as exc:  # a usage error has its report too (no store was opened: no credentials)
        if "--json" in argv or not _is_terminal(sys.stdout):
            _emit({"status": "usage-error", "error": {"type": "UsageError", "message": exc.message}, "credentials": None})
        raise
    _forget_credentials_used()  # a report names only this command's credentials
    logging.basicConfig(
        level=logging.INFO if args.verbose or getattr(args, "verbose_verb", False) else logging.WARNING,
        format="ckptflow: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    debug = os.environ.get("CKPTFLOW_DEBUG") == "1"
    as_json = args.json_global or bool(getattr(args, "json", False)) or not _is_terminal(sys.stdout)
    out = _Output(args.verb, as_json, args)
    started = time.monotonic()

    def fail(status: str, exc: BaseException, label: str | None = None) -> None:
        if debug:
            traceback.print_exc()
        line = f"ckptflow {args.verb}: {label or status}: {exc}"
        sys.stderr.write(line + "\n")
        out.error(_error_report(status, exc), line)

    try:
        report = args.func(args)
    except ReportedFailure as exc:
        out.report(exc.report, time.monotonic() - started)
        if as_json or not _same_file(sys.stdout, sys.stderr):  # on one terminal the summary already said it
            sys.stderr.write(f"ckptflow {args.verb}: {exc.line}\n")
        return EXIT_FAILED
    except MissingExtra as exc:
        fail("usage-error", exc, "missing extra")
        return EXIT_USAGE
    except UsageError as exc:
        fail("usage-error", exc, "usage error")
        return EXIT_USAGE
    except ModuleNotFoundError as exc:  # an optional dependency a verb's own check did not name
        extra = extra_of(exc.name)
        if extra is None:
            raise
        fail("usage-error", missing_extra(args.verb, extra, [exc.name or ""]), "missing extra")
        return EXIT_USAGE
    except CkptflowError as exc:
        fail("refused" if isinstance(exc, Refused | ConflictError) else "failed", exc)
        return EXIT_FAILED
    except OSError as exc:  # disk full, permission denied …: name the file, no traceback
        fail("failed", exc)
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write(f"ckptflow {args.verb}: interrupted; rerun the same command to continue\n")
        return 130
    out.report(report, time.monotonic() - started)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
