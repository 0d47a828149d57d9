"""The documentation site looks right at a laptop's width (1280 px), in a real browser.

The site built once (tests/conftest.py's ``built_site``, the strict build tests/test_docs.py checks) is
loaded in Debian's ``chromium-headless-shell`` (tests/helpers/browser.py; ``make test`` installs it) at
1280 x 900 px: the home page, a how-to, a verb's reference page and the configuration table. Each fails
when a code block or a table cell is cut off (content wider than its box that does not scroll with a
visible scrollbar), when a table reaches past the page's column, or when a word of a ``code`` in a table
cell (a key name, an option) breaks across lines. A code block that scrolls sideways with its scrollbar
is accepted. Each page's screenshot is left in ``.ckptflow/site-screenshots/`` for a person to look at.

The browser missing skips these tests with one line naming the remedy, except under CI (``CI`` set),
where they fail, as the Slurm tests do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import REPO, browser, docs_pages

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group(docs_pages.SITE_GROUP)]

PAGES = {
    "home": "index.html",
    "how-to": "how-to/training-job/index.html",
    "reference": "reference/cli/publish/index.html",
    "config": "reference/config/index.html",
}
SCREENSHOTS = REPO / ".ckptflow" / "site-screenshots"


@pytest.fixture(scope="module")
def chromium() -> str:
    found = browser.find()
    if found:
        return found
    why = browser.install_failure() or (
        f"{browser.cannot_install_reason() or browser.PROGRAM + ' is not installed'}; {browser.REMEDY}")
    message = f"no browser for the site's layout test: {why}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def site(built_site) -> Path:
    assert built_site.build.returncode == 0, built_site.build.stdout + built_site.build.stderr
    return built_site.path


def problems(found: dict) -> str:
    return "\n".join(json.dumps(p, sort_keys=True) for p in found["problems"][:20]) + (
        f"\n... {len(found['problems'])} in all" if len(found["problems"]) > 20 else "")


@pytest.mark.parametrize("name", PAGES)
def test_page_at_1280_px_cuts_no_code_block_or_table_cell_and_breaks_no_key_name(name, site, chromium):
    page = site / PAGES[name]
    found = browser.measure(chromium, page)
    shot = browser.screenshot(chromium, page, SCREENSHOTS / f"{name}.png", found["height"])
    assert found["width"] == browser.WIDTH
    assert found["checked"]["blocks"] + found["checked"]["cells"] > 0, found  # the page has something to check
    if name in ("reference", "config"):  # the option names and the keys were looked at
        assert found["checked"]["words"] >= 10, found
    assert not found["problems"], f"{PAGES[name]} at {browser.WIDTH} px (screenshot {shot}):\n{problems(found)}"


# A page that has each fault once, and a code block that scrolls with its scrollbar (accepted). The fonts and
# sizes are fixed, so the faults do not depend on the theme.
FAULTS = """<!doctype html>
<html><head><style>
  body { margin: 0; font: 16px monospace; }
  .md-content { width: 600px; }
  pre { margin: 8px 0; }
  table { border-collapse: collapse; }
</style></head><body><div class="md-content">
  <pre id="clipped" style="overflow: hidden">$ torchrun --standalone --nproc-per-node 2 examples/train_tiny.py --parallel ddp  # a comment cut off</pre>
  <pre id="hidden-bar" style="overflow-x: auto; scrollbar-width: none">$ ckptflow publish --artifact-dir runs/myproj/sft/run1/20261201T120000Z/checkpoint_artifacts/iter_000100</pre>
  <pre id="scrolls" style="overflow-x: auto">$ ckptflow verify --artifact-dir runs/myproj/sft/run1/20261201T120000Z/checkpoint_artifacts/iter_000100</pre>
  <div style="overflow-x: auto"><table><tr><td>key</td>
    <td style="white-space: nowrap">a meaning written on one line, far wider than the column of the page, cut at its edge</td></tr></table></div>
  <table style="width: 600px"><tr><td style="width: 60px; word-break: break-all"><code>materialize.expect_tensors</code></td>
    <td>a key name broken in the middle</td></tr></table>
</div></body></html>
"""


def test_the_measure_finds_a_cut_code_block_a_table_past_its_box_and_a_broken_key_name(tmp_path, chromium):
    page = tmp_path / "faults.html"
    page.write_text(FAULTS, encoding="utf-8")
    found = browser.measure(chromium, page)
    kinds = {(p["kind"], p["element"].split(":")[0]) for p in found["problems"]}
    assert ("content wider than its box", "pre") in kinds, found
    assert ("scrolls without a visible scrollbar", "pre") in kinds, found
    assert any(kind.startswith("cell past the right edge of div") for kind, _ in kinds), found
    assert [p["word"] for p in found["problems"] if p["kind"] == "word broken across lines"] == [
        "materialize.expect_tensors"], found
    assert [s["element"][:len("pre: $ ckptflow verify")] for s in found["scrolls"]] == ["pre: $ ckptflow verify"], found
    assert all("ckptflow verify" not in p["element"] for p in found["problems"]), found


def test_without_the_sites_stylesheet_the_config_tables_key_names_break(site, chromium):
    """The site's own stylesheet (docs/stylesheets/extra.css) is what keeps the keys whole at 1280 px."""
    page = site / PAGES["config"]
    bare = page.with_name("bare.html")
    html = page.read_text(encoding="utf-8")
    link = next(line for line in html.splitlines() if "stylesheets/extra.css" in line)
    bare.write_text(html.replace(link, ""), encoding="utf-8")
    try:
        found = browser.measure(chromium, bare)
    finally:
        bare.unlink()
    assert any(p["kind"] == "word broken across lines" for p in found["problems"]), found
