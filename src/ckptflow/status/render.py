"""The status report as text: an aligned table, a summary line and the details that need attention."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .report import COLUMNS, NONE

_HEADERS = ("RUN", "ITERATION", "LOCAL", "MERGED", "PUBLISHED", "VERIFIED", "PRUNED", "STAGED", "MATERIALIZED",
            "LOCAL SIZE", "ARCHIVED")
_DASH = "—"


def human_bytes(n: int | None) -> str:
    if n is None:
        return _DASH
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def _text(column: str, cell: dict[str, Any]) -> str:
    state = cell["state"]
    if state == NONE or (column == "local" and state == "absent"):
        return _DASH
    if column == "merged" and state == "merged":
        return f"{cell['mode']}, {_plural(cell['experts'], 'expert')}"
    if column == "verified" and "at" in cell:
        mark = " (stale)" if cell.get("stale") else (" (live)" if cell.get("source") == "live" else "")
        return f"{state}{mark} {cell['at']}"
    if column == "pruned" and state in ("partial", "missing"):
        return f"{state} ({cell['files']} files)"
    if column == "staged" and "components" in cell:
        return f"{state.replace('-', ' ')} ({', '.join(cell['components'])} only)"
    if column == "materialized" and state == "materialized":
        return f"{_short(cell['path'])} ({cell['source']})"
    return state.replace("-", " ")


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _short(path: str) -> str:
    """A path relative to the working directory when it lies below it (the table stays narrow)."""
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


def _details(row: dict[str, Any]) -> list[str]:
    return [f"{column}: {row[column]['detail']}" for column in COLUMNS if row[column].get("detail")]


def render_report(report: dict[str, Any]) -> str:
    """The report as an aligned text table, a summary line, and every cell's ``detail`` (what needs attention)."""
    rows = report["rows"]
    lines = [f"ckptflow status of {report['root']}"]
    unread = [f"{what} ({flag})" for what, key, flag in (
        ("verify/prune reports", "reports_dir", "--reports-dir"), ("staged copies", "stage_dir", "--stage-dir"),
        ("teachers", "teachers_dir", "--teachers-dir")) if report[key] is None]
    if unread:
        lines.append("not read: " + ", ".join(unread))
    if not rows:
        return "\n".join([*lines, "no artifacts found"]) + "\n"
    table = [_HEADERS] + [
        (r["run"], r["name"], *(_text(c, r[c]) for c in COLUMNS), human_bytes(r["local_bytes"]),
         human_bytes(r["archived_bytes"]))
        for r in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADERS))]
    right = {len(_HEADERS) - 2, len(_HEADERS) - 1}
    for line in table:
        cells = [v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in enumerate(zip(line, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    c = report["counts"]
    lines.append(
        f"{_plural(c['iterations'], 'iteration')} in {_plural(c['runs'], 'run')}: {c['committed']} committed, "
        f"{c['incomplete']} incomplete, {c['merged']} merged, {c['published']} published "
        f"({_plural(c['legacy_receipts'], 'legacy receipt')}), {c['verified']} verified, {c['pruned']} pruned, "
        f"{c['staged']} staged, {c['materialized']} materialized; local {human_bytes(report['local_bytes'])}, "
        f"archived {human_bytes(report['archived_bytes'])}"
    )
    notes = [f"  {r['run']} {r['name']} {p}" for r in rows for p in _details(r)]
    if notes:
        lines += ["details:", *notes]
    return "\n".join(lines) + "\n"
