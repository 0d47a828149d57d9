"""The documented command synopsis (docs/command-line.md) is the CLI's: for every verb ``cli.py`` registers, the options its
``--help`` shows are the options its synopsis line shows (both ways), and every positional
argument of ``--help`` is named there. ``--json``, ``-v/--verbose`` and ``-h/--help`` are shared by
every verb and said once in the synopsis's first line."""

from __future__ import annotations

import re

import pytest

from ckptflow.cli import VERBS
from helpers import REPO
from helpers.cli import run_cli

_OPTION = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
PAGE = "docs/command-line.md"
_SHARED = {"-h", "--help", "--json", "-v", "--verbose"}


def documented_synopsis() -> dict[str, str]:
    """Each verb's synopsis in the command line page's synopsis block: its ``ckptflow <verb>`` line and the
    indented lines that continue it."""
    text = (REPO / PAGE).read_text(encoding="utf-8")
    block = re.search(r"```text\n(ckptflow \[--json\] \[-v\] <verb>.*?)```", text, re.S)
    assert block, f"{PAGE} has no command synopsis block starting with `ckptflow [--json] [-v] <verb>`"
    verbs: dict[str, str] = {}
    current = None
    for line in block.group(1).splitlines():
        if m := re.match(r"ckptflow ([a-z][a-z-]*)\b(.*)", line):
            current = m.group(1)
            verbs[current] = verbs.get(current, "") + " " + m.group(2)
        elif line.startswith(" ") and current is not None:
            verbs[current] += " " + line
    return verbs


def help_of(verb: str) -> tuple[set[str], list[str]]:
    """The options in the usage of ``ckptflow <verb> --help`` and its positional arguments."""
    proc = run_cli(verb, "--help", json_report=False)
    assert proc.returncode == 0, proc.stderr
    usage, _, rest = proc.stdout.partition("\n\n")
    positionals = re.search(r"^positional arguments:\n((?:  .*\n?)*)", rest, re.M)
    names = re.findall(r"^  (\S+)", positionals.group(1), re.M) if positionals else []
    return set(_OPTION.findall(usage)) - _SHARED, names


@pytest.mark.parametrize("verb", VERBS)
def test_the_documented_synopsis_of_every_verb_matches_its_help(verb):
    synopsis = documented_synopsis()
    assert verb in synopsis, f"{PAGE}'s command synopsis has no line for `ckptflow {verb}`"
    options, positionals = help_of(verb)
    documented = set(_OPTION.findall(synopsis[verb])) - _SHARED
    assert documented - options == set(), f"{PAGE} synopsis of {verb} names options --help does not show"
    assert options - documented == set(), f"--help of {verb} shows options the synopsis in {PAGE} leaves out"
    for name in positionals:
        assert name in synopsis[verb], f"{PAGE} synopsis of {verb} does not name the positional {name}"
