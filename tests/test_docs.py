"""The documentation site cannot go stale: its generated reference pages are what the parser, the schemas and
the registry of destructive calls say today, and it builds with ``mkdocs build --strict``, offline.

The pages under docs/reference/ are written by tests/helpers/docs_pages.py (``make docs-pages``).
"""

from __future__ import annotations

import argparse

import pytest
import yaml

from helpers import REPO, docs_pages

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


def test_every_verb_has_a_reference_page_in_the_sites_navigation():
    from ckptflow import cli

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))

    def pages(nav):
        for item in nav:
            for value in item.values() if isinstance(item, dict) else [item]:
                yield from pages(value) if isinstance(value, list) else [value]

    listed = set(pages(config["nav"]))
    assert {f"reference/cli/{verb}.md" for verb in cli.VERBS} <= listed
    assert {f"reference/{path}" for path in docs_pages.pages()} <= listed


def test_the_site_needs_nothing_from_the_network():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["theme"]["font"] is False, "Material fetches its fonts from a font service unless font: false"
    assert config["plugins"] == ["search"], "a plugin may download at build time (social cards, privacy)"


@pytest.mark.xdist_group(docs_pages.SITE_GROUP)
def test_site_builds_strict_offline_without_a_warning(built_site):
    done = built_site.build
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert (built_site.path / "index.html").is_file()
    assert (built_site.path / "reference" / "cli" / "publish" / "index.html").is_file()
