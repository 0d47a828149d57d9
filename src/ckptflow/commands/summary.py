"""Human summaries of the verbs' JSON reports, printed instead of the report when stdout is a terminal.

The hook: a verb module (``commands/<verb>.py``) may define ``summarize(report, elapsed) -> str``, a few
lines for a person (what was done, how many files and bytes, where, how long). ``render`` uses it, and
falls back to ``generic`` (``key: value`` lines) for a verb that defines none. The JSON report stays
the contract: a summary only restates it, and a script never sees one (stdout is not a terminal, or
``--json``). The helpers below keep every verb's summary in one shape: a headline, then aligned rows.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

# Rows listed per group (failed objects, pruned artifacts) before "… N more"; the report has them all.
MAX_ROWS = 20


def human_bytes(n: int) -> str:
    """``1011 B``, ``1.50 KiB``, ``12.3 MiB``, ``450 GiB`` (binary units, three significant digits)."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if value < 1023.5 or unit == "PiB":
            break
    decimals = 2 if value < 9.995 else 1 if value < 99.95 else 0
    return f"{value:.{decimals}f} {unit}"


def human_duration(seconds: float) -> str:
    """``0.12 s``, ``4.3 s``, ``2 min 03 s``, ``1 h 02 min``."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def files_bytes(n_files: int, n_bytes: int) -> str:
    """``3 files, 1011 B``."""
    return f"{plural(n_files, 'file')}, {human_bytes(n_bytes)}"


def inventory_total(entries: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """(files, bytes) of a report's inventory (entries with ``size``)."""
    sizes = [int(e["size"]) for e in entries]
    return len(sizes), sum(sizes)


def destination_uri(dest: dict[str, Any], prefix: str | None = None) -> str:
    """A report's ``destination`` as one address: ``file:///root/prefix`` or ``s3://bucket/prefix at host:port``
    (``store.uri.destination_label``, the one place such an address is spelled); ``prefix`` overrides the
    destination's own."""
    from types import SimpleNamespace

    from ..store.uri import destination_label  # store code only when a summary is printed
    from ..store.uri import destination_uri as uri_of

    where = SimpleNamespace(scheme=dest.get("scheme", "s3"), endpoint=dest.get("endpoint") or "",
                            bucket=dest.get("bucket") or "")
    key = dest.get("prefix", "") if prefix is None else prefix
    return destination_label(where, key) if where.endpoint else str(uri_of(where, key))


def capped(rows: Sequence[tuple[str, str]], label: str) -> list[tuple[str, str]]:
    """At most ``MAX_ROWS`` rows, then one that says how many more the JSON report lists."""
    if len(rows) <= MAX_ROWS:
        return list(rows)
    return [*rows[:MAX_ROWS], (label, f"… {len(rows) - MAX_ROWS} more (--json lists them all)")]


def block(headline: str, rows: Iterable[tuple[str, Any]], elapsed: float | None) -> str:
    """The headline, then ``label  value`` rows aligned on the longest label (rows whose value is None
    or empty are left out), then how long the verb took."""
    kept = [(label, str(value)) for label, value in rows if value not in (None, "", [])]
    if elapsed is not None:
        kept.append(("took", human_duration(elapsed)))
    width = max((len(label) for label, _ in kept), default=0)
    return "\n".join([headline, *(f"  {label:<{width}}  {value}" for label, value in kept)])


def _value(value: Any) -> str:
    if isinstance(value, list):
        return f"{len(value)} entries" if value and isinstance(value[0], dict | list) else ", ".join(map(str, value))
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    return str(value)


def generic(report: dict[str, Any], elapsed: float | None) -> str:
    """``status`` first, then every other key of the report as ``key: value``."""
    rows = [(key, _value(report[key])) for key in sorted(report) if key not in ("status", "credentials")]
    return block(f"{report.get('status', 'done')}", rows, elapsed)


def render(verb: str, report: dict[str, Any], elapsed: float | None, args: Any = None) -> str:
    """The verb's own ``summarize`` when its module has one, else ``generic``; a ``summarize`` that takes
    ``args`` (display flags such as ``status --wide``) gets the parsed command line."""
    module = importlib.import_module(f"{__package__}.{verb.replace('-', '_')}")
    summarize = getattr(module, "summarize", generic)
    if args is not None and "args" in inspect.signature(summarize).parameters:
        return with_credentials(summarize(report, elapsed, args=args), report)
    return with_credentials(summarize(report, elapsed), report)


def with_credentials(text: str, report: dict[str, Any]) -> str:
    """``text`` with one ``credentials  file /path`` (or ``aws-chain env``) row before its ``took`` row,
    when the report names a credentials source."""
    used = report.get("credentials")
    if not used:
        return text
    detail = used.get("method") if used.get("source") == "aws-chain" else used.get("path")
    lines = text.split("\n")
    took = re.match(r"  took( +)", lines[-1])
    width = len("took") + len(took.group(1)) - 2 if took else 0
    lines.insert(len(lines) - 1 if took else len(lines),
                 f"  {'credentials':<{width}}  {used.get('source')} {detail or '(nothing found)'}")
    return "\n".join(lines)
