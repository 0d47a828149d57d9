"""The documentation cannot go stale: its generated reference pages are what the parser, the schemas and the
registry of destructive calls say today.

The pages under docs/reference/ are written by tests/helpers/docs_pages.py (``make docs-pages``).
"""

from __future__ import annotations

import argparse

from helpers import docs_pages

REGENERATE = "run `make docs-pages` (python tests/helpers/docs_pages.py) and commit docs/reference/"


def test_generated_reference_pages_equal_what_the_parser_schemas_and_registry_give_today():
    assert docs_pages.stale() == [], f"docs/reference/ is not current; {REGENERATE}"


def test_a_changed_option_makes_its_verbs_page_stale(tmp_path, monkeypatch):
    for path, text in docs_pages.pages().items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    assert docs_pages.stale(tmp_path) == []
    from ckptflow import cli

    original = cli.build_parser

    def with_new_option():
        parser = original()
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices["verify"].add_argument("--new-option", help="an option the pages do not know")
        return parser

    monkeypatch.setattr(cli, "build_parser", with_new_option)
    assert docs_pages.stale(tmp_path) == ["cli/verify.md"]
