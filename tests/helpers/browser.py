"""A real browser for the documentation site's layout test: Debian's ``chromium-headless-shell``.

    python tests/helpers/browser.py install      # apt-get install it when missing (root); `make test` runs it

``install`` installs the Debian package ``chromium-headless-shell`` (``--no-install-recommends``: the
headless shell alone, without the desktop ``chromium``'s graphical stack) and the font the pages are
measured with (``fonts-dejavu-core``) with apt-get when the program is missing, through tests/helpers/apt.py
(one install at a time, beside Slurm's). Exit status: 0 installed (or already there), 1 failure, 3 this
machine cannot install it (not root, or no apt-get); a failure prints one line naming the reason and the
remedy and leaves it in ``.ckptflow/browser-install-failed.txt`` until the next install succeeds:
tests/test_docs_browser.py skips with that line outside CI and fails with it under CI, as the Slurm tests do.

``measure(program, page)`` loads a copy of a built page (beside it, so its relative links still resolve)
with ``LAYOUT_SCRIPT`` added, at 1280 x 900 px, with ``--dump-dom``: the script measures the page once it
has loaded and writes what it found into the DOM as JSON (base64 in an attribute, nothing to unescape).
``screenshot`` takes a picture of the whole page (the window as tall as the page) for a person to look at.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__:
    from . import apt
else:  # run as a script: tests/helpers is sys.path[0]
    import apt

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "chromium-headless-shell"
PROGRAM = "chromium-headless-shell"
# The font the pages are measured with (Material's system font stack falls back to it on Debian), named so
# that a fresh machine gets the same one whichever font fontconfig's dependency would otherwise bring.
FONTS = "fonts-dejavu-core"
INSTALL_FAILED = REPO / ".ckptflow" / "browser-install-failed.txt"
REMEDY = f"install it as root: `python tests/helpers/browser.py install` (apt-get install {PACKAGE})"
CANNOT = 3
WIDTH, HEIGHT = 1280, 900
# A screenshot of a longer page is cut at this height (Chromium's largest window).
MAX_SHOT_HEIGHT = 16384
TIMEOUT = 60

# What the layout test measures, in the page itself once it has loaded (Material has wrapped its tables by
# then), in the content area (.md-content):
# - a code block (pre, pre > code) or a table cell (td, th) whose content is wider than its box is cut
#   off (or spills over its neighbour) unless the box scrolls (overflow auto or scroll) with a scrollbar
#   that takes room, i.e. one a reader sees; such a block is listed under "scrolls";
# - a table cell that reaches past the right edge of a box that clips it (the table itself or Material's
#   scroll wrapper around it): the table is wider than the page's column, and what is right of the edge is
#   not seen without scrolling the table;
# - a word of a `code` in a table cell (a key name, an option) that spans two lines: it broke inside;
# - the page itself wider than the window.
LAYOUT_SCRIPT = r"""
<script id="ckptflow-layout-script">
(function () {
  function name(el) {
    var text = (el.textContent || "").replace(/\s+/g, " ").trim();
    return el.tagName.toLowerCase() + (el.className ? "." + String(el.className).split(" ")[0] : "") +
      ": " + text.slice(0, 80);
  }
  function scrollbarRoom(el, style) {
    return el.offsetHeight - el.clientHeight - parseFloat(style.borderTopWidth) - parseFloat(style.borderBottomWidth);
  }
  function clippers(el, top) {
    var found = [];
    for (var p = el.parentElement; p && p !== top.parentElement; p = p.parentElement) {
      if (getComputedStyle(p).overflowX !== "visible") found.push(p);
    }
    return found;
  }
  function measure() {
    var found = {width: window.innerWidth, height: document.documentElement.scrollHeight,
                 checked: {blocks: 0, cells: 0, words: 0}, problems: [], scrolls: []};
    var content = document.querySelector(".md-content") || document.body;
    if (document.documentElement.scrollWidth > document.documentElement.clientWidth) {
      found.problems.push({kind: "page wider than the window", element: "html",
                           scroll_width: document.documentElement.scrollWidth, client_width: document.documentElement.clientWidth});
    }
    content.querySelectorAll("pre, pre > code, td, th").forEach(function (el) {
      var cell = el.tagName === "TD" || el.tagName === "TH";
      found.checked[cell ? "cells" : "blocks"] += 1;
      var style = getComputedStyle(el);
      if (el.scrollWidth > el.clientWidth) {
        var scrolling = style.overflowX === "auto" || style.overflowX === "scroll";
        if (scrolling && scrollbarRoom(el, style) > 0) {
          found.scrolls.push({element: name(el), scroll_width: el.scrollWidth, client_width: el.clientWidth});
        } else {
          found.problems.push({kind: scrolling ? "scrolls without a visible scrollbar" : "content wider than its box",
                               element: name(el), scroll_width: el.scrollWidth, client_width: el.clientWidth});
        }
      }
      if (cell) {
        var right = el.getBoundingClientRect().right;
        clippers(el, content).forEach(function (box) {
          var edge = box.getBoundingClientRect().right;
          if (right > edge + 1) {
            found.problems.push({kind: "cell past the right edge of " + name(box).split(":")[0], element: name(el),
                                 right: Math.round(right), edge: Math.round(edge)});
          }
        });
      }
    });
    content.querySelectorAll("td code, th code").forEach(function (code) {
      var walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT), node;
      while ((node = walker.nextNode())) {
        var re = /\S+/g, m;
        while ((m = re.exec(node.data))) {
          found.checked.words += 1;
          var range = document.createRange();
          range.setStart(node, m.index);
          range.setEnd(node, m.index + m[0].length);
          var lines = {};
          Array.prototype.forEach.call(range.getClientRects(), function (r) {
            if (r.width > 0) lines[Math.round(r.top)] = true;
          });
          if (Object.keys(lines).length > 1) {
            found.problems.push({kind: "word broken across lines", element: name(code.closest("td, th") || code),
                                 word: m[0]});
          }
        }
      }
    });
    var out = document.createElement("div");
    out.id = "ckptflow-layout";
    out.setAttribute("data-json", btoa(unescape(encodeURIComponent(JSON.stringify(found)))));
    document.body.appendChild(out);
  }
  window.addEventListener("load", function () { setTimeout(measure, 200); });
})();
</script>
"""
RESULT = re.compile(r'<div id="ckptflow-layout" data-json="([A-Za-z0-9+/=]*)"')


class BrowserError(RuntimeError):
    """The browser is missing, cannot be installed or did not give a result; the message names the remedy."""


def find() -> str | None:
    return shutil.which(PROGRAM)


def cannot_install_reason() -> str | None:
    """Why ``install`` cannot work on this machine, or None."""
    if find():
        return None
    if os.geteuid() != 0:
        return f"{PROGRAM} is not installed, and apt-get installs it as root only"
    if not shutil.which("apt-get"):
        return f"{PROGRAM} is not installed, and there is no apt-get to install {PACKAGE}"
    return None


def install() -> str:
    reason = cannot_install_reason()
    if reason:
        raise BrowserError(reason)
    try:
        apt.install([PACKAGE, FONTS], lambda: [] if find() else [PROGRAM])
    except apt.AptError as exc:
        raise BrowserError(str(exc)) from None
    return find() or PROGRAM


def install_failure() -> str | None:
    """The one line of the last failed ``install`` (the reason and the remedy), or None."""
    try:
        return INSTALL_FAILED.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _chromium(program: str, url: str, *args: str, height: int = HEIGHT) -> subprocess.CompletedProcess:
    # Its own profile directory (nothing read from or left in a home directory); --no-sandbox: the tests may
    # run as root, where Chromium's sandbox refuses to start.
    with tempfile.TemporaryDirectory(prefix="ckptflow-chromium-") as profile:
        cmd = [program, "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
               f"--window-size={WIDTH},{height}", *args, url]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT)


def measure(program: str, page: Path) -> dict:
    """What LAYOUT_SCRIPT finds in ``page`` (an HTML file), from a copy of it beside it."""
    copy = page.with_name(f".layout-{page.name}")
    html = page.read_text(encoding="utf-8")
    head = html.lower().rfind("</body>")
    assert head >= 0, f"{page}: no </body>"
    copy.write_text(html[:head] + LAYOUT_SCRIPT + html[head:], encoding="utf-8")
    try:
        done = _chromium(program, copy.as_uri(), "--virtual-time-budget=5000", "--dump-dom")
    finally:
        copy.unlink()
    found = RESULT.search(done.stdout)
    if not found:
        raise BrowserError(f"{program} gave no layout result for {page} (exit {done.returncode}):\n"
                           f"{done.stderr[-2000:]}")
    return json.loads(base64.b64decode(found.group(1)).decode("utf-8"))


def screenshot(program: str, page: Path, out: Path, height: int) -> Path:
    """A screenshot of ``page`` at the layout's width, the window as tall as the page (up to MAX_SHOT_HEIGHT)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    done = _chromium(program, page.as_uri(), "--virtual-time-budget=2000", f"--screenshot={out}",
                     height=max(HEIGHT, min(height, MAX_SHOT_HEIGHT)))
    if not out.is_file():
        raise BrowserError(f"{program} wrote no screenshot of {page} (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["install"])
    parser.parse_args(argv)
    reason = cannot_install_reason()
    try:
        found = install()
    except BrowserError as exc:
        line, _, details = str(exc).partition("\n")
        line = f"{line}; {REMEDY}" if reason else f"{PACKAGE} did not install: {line}; {REMEDY}"
        sys.stderr.write(f"browser.py install: {line}\n" + (f"{details}\n" if details else ""))
        with contextlib.suppress(OSError):
            INSTALL_FAILED.parent.mkdir(parents=True, exist_ok=True)
            INSTALL_FAILED.write_text(line + "\n", encoding="utf-8")
        return CANNOT if reason else 1
    INSTALL_FAILED.unlink(missing_ok=True)
    sys.stdout.write(f"{found}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
