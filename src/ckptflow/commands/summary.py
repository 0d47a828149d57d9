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
from collections.abc import Iterable, Sequence
from typing import Any

from ..records import is_record, payload_sizes
from ..units import human_bytes  # the one size format; verbs import it from here

# Rows listed per group (failed objects, pruned artifacts) before "… N more"; the report has them all.
MAX_ROWS = 20


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


# One vocabulary in every summary: an artifact's *payload files* are what its manifest records (what seal
# commits, prune frees, restore and fetch download); its *records* are ckptflow's own JSON beside them (the
# manifest, the declaration, the part digests, a legacy manifest's original); the archive holds *objects*:
# payload files and records. A count is always named as one of the three, and its bytes are always that
# count's bytes. The definition is ``records.sizes``' (``is_record``, ``payload_bytes``), which status and ls use too.


def files_bytes(n_files: int, n_bytes: int, noun: str = "payload file") -> str:
    """``3 payload files, 1011 B`` (or another ``noun``: ``5 objects, 3.10 MiB``)."""
    return f"{plural(n_files, noun)}, {human_bytes(n_bytes)}"


def inventory_total(entries: Iterable[dict[str, Any]]) -> tuple[int, int]:
    """(payload files, payload bytes) of a report's inventory (entries with ``path`` and ``size``): the
    records it lists (the manifest) are counted by ``records_in``."""
    sizes = payload_sizes(entries)
    return len(sizes), sum(sizes)


def records_in(entries: Iterable[dict[str, Any]]) -> int:
    return sum(1 for e in entries if is_record(e["path"]))


def held_text(held: list[dict]) -> str:
    """Which payloads stay on disk under other names, and those names (a report's ``held``)."""
    parts = [f"{h['file']} (also {', '.join(h['other_names'][:2]) or 'outside the run directory'}"
             f"{' ...' if len(h['other_names']) > 2 else ''})" for h in held[:3]]
    return "; ".join(parts) + (f" (+{len(held) - 3} more)" if len(held) > 3 else "")


def payload_and_records(n_files: int, n_bytes: int, n_records: int) -> str:
    """``3 payload files, 3.10 MiB as 5 objects (with 2 records)``: what an archive of them holds."""
    return (f"{files_bytes(n_files, n_bytes)} as {plural(n_files + n_records, 'object')} "
            f"(with {plural(n_records, 'record')})")


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


class Block(str):
    """A summary built by ``block``: its text, and the rows it was built from (so ``render`` can add
    the credentials row aligned with the others)."""

    headline: str
    rows: list[tuple[str, Any]]
    elapsed: float | None


def block(headline: str, rows: Iterable[tuple[str, Any]], elapsed: float | None) -> Block:
    """The headline, then ``label  value`` rows aligned on the longest label (rows whose value is None
    or empty are left out), then how long the verb took."""
    rows = list(rows)
    kept = [(label, str(value)) for label, value in rows if value not in (None, "", [])]
    if elapsed is not None:
        kept.append(("took", human_duration(elapsed)))
    width = max((len(label) for label, _ in kept), default=0)
    text = Block("\n".join([headline, *(f"  {label:<{width}}  {value}" for label, value in kept)]))
    text.headline, text.rows, text.elapsed = headline, rows, elapsed
    return text


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
    """``text`` with one ``credentials  file /path`` (or ``aws-chain env``) row, when the report names a
    credentials source: in a ``block`` summary aligned with its rows, before ``took``; after any other."""
    used = report.get("credentials")
    if not used:
        return text
    detail = used.get("method") if used.get("source") == "aws-chain" else used.get("path")
    row = ("credentials", f"{used.get('source')} {detail or '(nothing found)'}")
    if isinstance(text, Block):
        return str(block(text.headline, [*text.rows, row], text.elapsed))
    return f"{text}\n  {row[0]}  {row[1]}"
