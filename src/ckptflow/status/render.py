"""The status report as text: an aligned table, a summary line and the details that need attention.

Two layouts of the same report. ``width=None`` (``--wide``, and the workflow's table file) shows every
column with full timestamps and paths. A width (a terminal's) keeps that layout when it fits with times
as ages and teacher paths relative to the teachers directory, else gives the compact table: rows grouped
under their run, the iteration as a number, publication and verification in one ARCHIVE column with the
verification's age (``verified 2h ago``), the teacher as where it was built from (its path is
``<teachers_dir>/<run>/iter_N``, which the row names), the local size only. A cell still too wide keeps
its leading words and ends in ``…`` (a word is never cut); where even that does not fit, the least read
columns are left out, said in one line; a run name too wide is shortened in its middle (a path: ``…``),
and the summary line is wrapped, so no line exceeds the width.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import units
from .report import COLUMNS, NONE

_HEADERS = ("RUN", "ITERATION", "LOCAL", "MERGED", "PUBLISHED", "VERIFIED", "PRUNED", "STAGED", "MATERIALIZED",
            "LOCAL SIZE", "ARCHIVED")
_DASH = "—"


def human_bytes(n: int | None) -> str:
    """``units.human_bytes`` (the size format of every summary), ``—`` for an unknown size."""
    return _DASH if n is None else units.human_bytes(n)


def _text(column: str, cell: dict[str, Any], fit: _Fit | None = None) -> str:
    """A cell as text; with ``fit`` (a terminal), times as ages and teacher paths relative to teachers_dir."""
    state = cell["state"]
    if state == NONE or (column == "local" and state == "absent"):
        return _DASH
    if column == "merged" and state == "merged":
        return f"{cell['mode']}, {_plural(cell['experts'], 'expert')}"
    if column == "verified" and "at" in cell:
        mark = " (stale)" if cell.get("stale") else (" (live)" if cell.get("source") == "live" else "")
        return f"{state}{mark} {age(cell['at'], fit.now) if fit else cell['at']}"
    if column == "pruned" and state in ("partial", "missing"):
        return f"{state} ({_plural(cell['files'], 'payload file')})"
    if column == "staged" and "components" in cell:
        return f"{state.replace('-', ' ')} ({', '.join(cell['components'])} only)"
    if column == "materialized" and state == "materialized":
        return f"{_short(cell['path'], fit.teachers_dir if fit else None)} ({cell['source']})"
    return state.replace("-", " ")


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _short(path: str, base: str | None = None) -> str:
    """A path relative to ``base`` (else the working directory) when it lies below it (the table stays narrow)."""
    try:
        return str(Path(path).relative_to(Path(base) if base else Path.cwd()))
    except ValueError:
        return path


@dataclass(frozen=True)
class _Fit:
    now: datetime
    teachers_dir: str | None


def _details(row: dict[str, Any]) -> list[str]:
    return [f"{column}: {row[column]['detail']}" for column in COLUMNS if row[column].get("detail")]


def render_report(report: dict[str, Any], *, width: int | None = None, now: datetime | None = None) -> str:
    """The report as an aligned text table, a summary line, and every cell's ``detail`` (what needs
    attention); with ``width``, the compact table that fits it (see the module docstring)."""
    if width is not None:
        now = now or datetime.now(timezone.utc)
        full = _render_full(report, _Fit(now, report["teachers_dir"]))
        table = full.split("\ndetails:\n", 1)[0]  # the details are messages, wrapped by the terminal
        if max(map(len, table.splitlines())) <= width:
            return full
        return _render_compact(report, max(width, _MIN_WIDTH), now)
    return _render_full(report)


def _render_full(report: dict[str, Any], fit: _Fit | None = None) -> str:
    rows = report["rows"]
    lines = [f"ckptflow status of {report['root']}"]
    unread = [f"{what} ({flag})" for what, key, flag in (
        ("verify/prune reports", "reports_dir", "--reports-dir"), ("staged copies", "stage_dir", "--stage-dir"),
        ("teachers", "teachers_dir", "--teachers-dir")) if report[key] is None]
    if unread and _asked_for_workflow(report):
        lines.append("not read: " + ", ".join(unread))
    if not rows:
        return "\n".join([*lines, "no artifacts found"]) + "\n"
    table = [_HEADERS] + [
        (r["run"], r["name"], *(_text(c, r[c], fit) for c in COLUMNS), human_bytes(r["local_bytes"]),
         human_bytes(r["archived_bytes"]))
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADERS))]
    right = {len(_HEADERS) - 2, len(_HEADERS) - 1}
    for line in table:
        cells = [v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(line, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    lines.append(_counts_line(report))
    notes = [f"  {r['run']} {r['name']} {p}" for r in rows for p in _details(r)]
    if notes:
        lines += ["details:", *notes]
    return "\n".join(lines) + "\n"


def _asked_for_workflow(report: dict[str, Any]) -> bool:
    """Whether the workflow's directories were asked for (one of them given): only then are the ones not
    given named, as not read; a user of the command line alone hears nothing about them."""
    return any(report[key] is not None for key in ("reports_dir", "stage_dir", "teachers_dir"))


def _counts_line(report: dict[str, Any]) -> str:
    c = report["counts"]
    return (
        f"{_plural(c['iterations'], 'iteration')} in {_plural(c['runs'], 'run')}: {c['committed']} committed, "
        f"{c['incomplete']} incomplete, {c['merged']} merged, {c['published']} published "
        f"({_plural(c['legacy_receipts'], 'legacy receipt')}), {c['verified']} verified, {c['pruned']} pruned, "
        f"{c['staged']} staged, {c['materialized']} materialized; local {human_bytes(report['local_bytes'])}, "
        f"archived {human_bytes(report['archived_bytes'])}"
    )


# ------------------------------------------------------------------------------------- compact table

_MIN_WIDTH = 40
COMPACT_HEADERS = ("ITER", "LOCAL", "MERGED", "ARCHIVE", "PRUNED", "STAGED", "TEACHER", "SIZE")
_INDENT = "  "


def age(at: str, now: datetime) -> str:
    """``2h ago`` for an ISO-8601 UTC time (``at`` itself when it cannot be read)."""
    try:
        then = datetime.strptime(at[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        return at
    seconds = int((now - then).total_seconds())
    if seconds < 0:
        return "just now"  # a clock ahead of ours
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _archive_text(row: dict[str, Any], now: datetime) -> str:
    """Publication and verification in one cell: ``verified 2h ago``, ``receipt`` (not verified), …"""
    published, verified = row["published"]["state"], row["verified"]
    if published == NONE:
        return _DASH
    if published != "receipt":
        return {"legacy-receipt": "legacy receipt", "foreign": "foreign receipt"}.get(published, f"{published} receipt")
    if verified["state"] == NONE:
        return "receipt"
    text = verified["state"] + (f" {age(verified['at'], now)}" if "at" in verified else "")
    return text + (" (stale)" if verified.get("stale") else "")


def compact_cells(row: dict[str, Any], now: datetime) -> tuple[str, ...]:
    merged = row["merged"]
    teacher = row["materialized"]
    return (
        str(row["iteration"]),
        _text("local", row["local"]),
        f"{merged['mode']} ×{merged['experts']}" if merged["state"] == "merged" else _text("merged", merged),
        _archive_text(row, now),
        _text("pruned", row["pruned"]),
        _text("staged", row["staged"]),
        teacher["source"] if teacher["state"] == "materialized" else _text("materialized", teacher),
        human_bytes(row["local_bytes"]),
    )


def middle(text: str, width: int) -> str:
    """``text`` shortened to ``width`` characters by an ellipsis in its middle."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    head = width // 2
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def words(text: str, width: int) -> str:
    """``text`` in ``width`` characters without cutting a word: the leading words that fit and ``…``
    (``verified 2h …``); ``text`` itself when it fits. A first word longer than ``width`` is the caller's
    to avoid (``_fit_columns`` never makes a column narrower than its cells' first words)."""
    if len(text) <= width:
        return text
    kept = ""
    for word in text.split(" "):
        candidate = f"{kept} {word}" if kept else word
        if len(candidate) + 2 > width:  # room for " …"
            break
        kept = candidate
    return f"{kept} …" if kept else text


def _min_width(cell: str) -> int:
    first, _, rest = cell.partition(" ")
    return len(first) + (2 if rest else 0)


# The columns dropped first when even words whole do not fit: what a person reads last.
_DROP_ORDER = ("TEACHER", "STAGED", "MERGED", "PRUNED", "SIZE")


def _fit_columns(table: list[tuple[str, ...]], room: int) -> tuple[list[int], list[int]]:
    """The columns to show and their widths within ``room`` (two spaces between columns): the widest
    column shrinks first, never below its header or the first word of any of its cells (a word is never
    cut: ``comm…ted`` would read as nothing); when that is still too wide, whole columns are left out in
    ``_DROP_ORDER``. ITER, LOCAL and ARCHIVE always stay."""
    keep = list(range(len(COMPACT_HEADERS)))
    full = {i: max(len(line[i]) for line in table) for i in keep}
    floor = {i: max(len(COMPACT_HEADERS[i]), *(_min_width(line[i]) for line in table[1:])) for i in keep}
    drop = [COMPACT_HEADERS.index(h) for h in _DROP_ORDER]
    while sum(floor[i] for i in keep) + 2 * (len(keep) - 1) > room and drop:
        keep.remove(drop.pop(0))
    widths = {i: full[i] for i in keep}
    while sum(widths.values()) + 2 * (len(keep) - 1) > room:
        i = max(keep, key=lambda k: widths[k] - floor[k])
        if widths[i] <= floor[i]:
            break
        widths[i] -= 1
    return keep, [widths[i] for i in keep]


def _render_compact(report: dict[str, Any], width: int, now: datetime) -> str:
    rows = report["rows"]
    lines = [middle(f"ckptflow status of {report['root']}", width)]
    unread = [flag for key, flag in (("reports_dir", "--reports-dir"), ("stage_dir", "--stage-dir"),
                                     ("teachers_dir", "--teachers-dir")) if report[key] is None]
    if unread and _asked_for_workflow(report):
        lines += textwrap.wrap("not read (pass " + ", ".join(unread) + ")", width)
    if not rows:
        return "\n".join([*lines, "no artifacts found"]) + "\n"
    table = [COMPACT_HEADERS] + [compact_cells(r, now) for r in rows]
    keep, widths = _fit_columns(table, width - len(_INDENT))
    left_out = [h for i, h in enumerate(COMPACT_HEADERS) if i not in keep]
    if left_out:
        lines += textwrap.wrap(f"not shown for want of width: {', '.join(left_out)} (ckptflow status --wide shows "
                               "every column)", width)
    table = [tuple(line[i] for i in keep) for line in table]
    right = {len(keep) - 1} if keep[-1] == len(COMPACT_HEADERS) - 1 else set()

    def fmt(line: tuple[str, ...]) -> str:
        cells = [words(v, w).rjust(w) if i in right else words(v, w).ljust(w)
                 for i, (v, w) in enumerate(zip(line, widths, strict=True))]
        return (_INDENT + "  ".join(cells)).rstrip()

    lines.append(fmt(table[0]))
    run = None
    for row, cells in zip(rows, table[1:], strict=True):
        if row["run"] != run:
            run = row["run"]
            lines.append(middle(run, width))
        lines.append(fmt(cells))
    lines += textwrap.wrap(_counts_line(report), width)
    notes = [f"{r['run']} {r['name']} {p}" for r in rows for p in _details(r)]
    if notes:
        lines.append("details (ckptflow status --wide shows every column):")
        for note in notes:
            # a path longer than the width stays whole (copied, not read): the table itself always fits
            lines += textwrap.wrap(note, width, initial_indent=_INDENT, subsequent_indent=_INDENT * 2,
                                   break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines) + "\n"
