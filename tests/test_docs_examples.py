"""The sample outputs the documentation shows (docs/examples/, included by the pages, and README.md's one
block) are what the verbs and the workflow's checks print today: tests/helpers/docs_examples.py takes the
quick start's checkpoint through its life again, on the running SeaweedFS, then dry-runs the workflow into
its refusals, and every committed sample must equal what it gives, byte for byte."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import REPO, docs_examples


@pytest.mark.seaweedfs
@pytest.mark.slow
def test_every_committed_sample_is_what_the_verbs_print_today(seaweedfs_credentials_path: Path):
    samples = docs_examples.generate(seaweedfs_credentials_path)
    stale = docs_examples.differ(samples)
    shown = []
    for name in stale:
        committed = docs_examples.EXAMPLES / name
        was = committed.read_text(encoding="utf-8") if committed.is_file() else "(no such file)\n"
        now = samples.get(name, "(not written)\n")
        shown.append(f"--- docs/examples/{name}, committed\n{was}--- today\n{now}")
    stale = [f"docs/examples/{name}" for name in stale]
    readme = docs_examples.README.read_text(encoding="utf-8")
    if docs_examples.readme(readme, samples[docs_examples.README_SAMPLE]) != readme:
        stale.append("README.md")
    assert not stale, f"{', '.join(stale)}: not what the verbs print today; {docs_examples.REGENERATE}\n" + "".join(shown)


def test_the_readmes_sample_is_the_committed_publish_sample():
    readme = docs_examples.README.read_text(encoding="utf-8")
    sample = (docs_examples.EXAMPLES / docs_examples.README_SAMPLE).read_text(encoding="utf-8")
    assert docs_examples.readme(readme, sample) == readme, (
        f"README.md: its sample (after {docs_examples.README_BEGIN}) is not docs/examples/{docs_examples.README_SAMPLE}; "
        f"{docs_examples.REGENERATE}")


def test_each_committed_sample_is_a_terminals_summary_with_nothing_of_the_run_that_wrote_it():
    samples = {path.name: path.read_text(encoding="utf-8") for path in docs_examples.EXAMPLES.glob("*.txt")}
    assert sorted(samples) == sorted([*(f"{s.name}.txt" for s in docs_examples.SAMPLES), docs_examples.CONFIG_ERRORS_FILE])
    for name, text in samples.items():
        assert not text.lstrip().startswith("{"), f"{name}: a JSON report, not the summary\n{text}"
        assert "/tmp/" not in text and "ckptflow-docs-examples-" not in text, f"{name}\n{text}"
        assert not re.search(r"127\.0\.0\.1:\d", text) and not re.search(r"\d\.\d\d s\n", text), f"{name}\n{text}"
    assert samples["publish.txt"].startswith("published 3 payload files, ")
    assert "  credentials  env:CKPTFLOW_CREDENTIALS $PWD/.ckptflow/s3/credentials-seaweedfs.json\n" in samples["publish.txt"]
    assert " <age> ago " in samples["status.txt"]
    # each dry run's command line, then the one line it was refused with
    lines = samples[docs_examples.CONFIG_ERRORS_FILE].splitlines()
    assert [line.split()[1] for line in lines[::2]] == ["snakemake"] * len(docs_examples.CONFIG_ERRORS), lines
    assert all(line.startswith("ckptflow: ") for line in lines[1::2]) and len(lines) == 2 * len(docs_examples.CONFIG_ERRORS)


def test_every_sample_the_generator_writes_is_included_by_a_page_and_every_include_names_one():
    included = {match for page in (REPO / "docs").rglob("*.md")
                for match in re.findall(r'^--8<-- "examples/([^"]+)"$', page.read_text(encoding="utf-8"), re.M)}
    written = {f"{s.name}.txt" for s in docs_examples.SAMPLES} | {docs_examples.CONFIG_ERRORS_FILE}
    assert included <= written, f"a page includes a sample nobody writes: {sorted(included - written)}"
    assert written <= included, f"a sample no page shows: {sorted(written - included)}"


def _status(ages: tuple[str, str], width: int) -> str:
    """The compact status table as ``status/render.py`` aligns it, the ARCHIVE column ``width`` wide."""
    cells = [f"verified {age}".ljust(width) for age in ages]
    return (f"ckptflow status of runs\n  ITER  LOCAL      MERGED  {'ARCHIVE'.ljust(width)}  PRUNED  STAGED  TEACHER     SIZE\n"
            "myproj/sft/run1/20261201T120000Z\n"
            f"  100   committed  —       {cells[0]}  —       —       —        343 KiB\n"
            f"  200   committed  —       {cells[1]}  —       —       —        343 KiB\n"
            "2 iterations in 1 run: 2 committed\n")


def test_the_placeholders_keep_a_table_aligned_whatever_the_ages(tmp_path):
    expected = _status(("<age> ago", "<age> ago"), 18).replace("of runs", "of $PWD/runs")
    for ages, width in ((("12s ago", "3m ago"), 16), (("2s ago", "1h ago"), 15)):
        table = _status(ages, width).replace("of runs", f"of {tmp_path}/runs")
        assert docs_examples.normalise(table, workdir=tmp_path, bucket="b") == expected
