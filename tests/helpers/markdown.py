"""The fenced blocks of a Markdown page (the documentation's commands and scripts, which tests run or submit)."""

from __future__ import annotations


def fenced(text: str) -> list[tuple[str, list[str]]]:
    """Each fenced block of a page: its language and its lines."""
    blocks, lang, lines = [], None, []
    for line in text.splitlines():
        if lang is None and line.startswith("```"):
            lang, lines = line[3:].strip(), []
        elif lang is not None and line == "```":
            blocks.append((lang, lines))
            lang = None
        elif lang is not None:
            lines.append(line)
    assert lang is None, "a fenced block is not closed"
    return blocks
