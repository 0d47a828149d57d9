"""Sizes for people: the one place a byte count is turned into text (summaries, ``status``, ``ls``,
messages), so one artifact's size reads the same in every verb."""

from __future__ import annotations


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
