"""Writes the sample outputs the documentation shows (``docs/examples/*.txt``) from real runs of the verbs.

The quick start's checkpoint is taken through its whole life as a user takes it: in a working directory of
its own, ``runs/myproj/sft/run1/20261201T120000Z/checkpoint_artifacts/iter_000100`` holding ``model.pt``
and a DCP ``optim/`` (``artifacts.write_payloads``: the test suite's tiny artifact, one optimizer shard as
a single process saves it), the archive a SeaweedFS bucket named by ``CKPTFLOW_BUCKET`` and its credentials
file named by ``CKPTFLOW_CREDENTIALS`` at ``.ckptflow/s3/credentials-seaweedfs.json`` (what ``make s3-up``
writes and tells to export), the terminal 80 columns wide. Each verb of ``SAMPLES`` runs in turn with its
stdout on a pseudo-terminal, so it prints the human summary a person sees (the JSON report goes to pipes
only), and must exit as the sample says (0, with nothing on stderr, but for a refusal). What differs from one run to the next is then replaced by a
placeholder (``normalise``: the working directory, the cache, the bucket, the port, digests, times and
durations), so the same inputs give byte-identical files.

    python tests/helpers/docs_examples.py            # make docs-examples: rewrites docs/examples/
    python tests/helpers/docs_examples.py --check    # lists the samples that differ, exit 1

Both start a SeaweedFS of their own on free loopback ports (``servers.py``'s ``local`` profile, the one
``make s3-up`` starts, under a temporary directory) and stop it by its PID. ``tests/test_docs_examples.py``
runs the same ``generate`` on the running test server instead (a bucket of its own) and compares. The pages
include the files with ``pymdownx.snippets`` (``--8<-- "examples/publish.txt"`` inside a fenced block), so a
verb whose output changes fails that test until this is run again and the files committed.
"""

from __future__ import annotations

import argparse
import re
import shutil
import socket
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: tests/ holds the helpers

from helpers import REPO, servers
from helpers.artifacts import write_payloads
from helpers.cli import run_on_terminal

EXAMPLES = REPO / "docs" / "examples"
REGENERATE = "run `make docs-examples` (python tests/helpers/docs_examples.py) and commit docs/examples/"

# The quick start's names: the user's bucket (make s3-up's), run, artifact and probe prefix.
BUCKET = "ckptflow-local"
RUN = "myproj/sft/run1/20261201T120000Z"
ARTIFACT = f"runs/{RUN}/checkpoint_artifacts/iter_000100"
URI = f"s3://{BUCKET}/{RUN}/checkpoint_artifacts/iter_000100"
CREDENTIALS = Path(".ckptflow") / "s3" / "credentials-seaweedfs.json"  # below the working directory
COLUMNS = 80


@dataclass(frozen=True)
class Sample:
    """``docs/examples/<name>.txt``: what ``ckptflow <args>`` prints on a terminal at this point of the life,
    exiting ``exit``: a verb that succeeds writes nothing to stderr; one that refuses is shown as a terminal
    that is both its stdout and stderr shows it."""

    name: str
    args: tuple[str, ...]
    exit: int = 0


# In the order they run, each from what the ones before left: the quick start's order, then ls, fetch and resume-check.
SAMPLES = (
    Sample("seal", ("seal", "--artifact-dir", ARTIFACT, "--iteration", "100", "model=model.pt", "optim=optim")),
    Sample("probe", ("probe", "--prefix", "try")),
    Sample("publish-dry-run", ("publish", "--artifact-dir", ARTIFACT, "--dry-run")),
    Sample("publish", ("publish", "--artifact-dir", ARTIFACT)),
    Sample("verify", ("verify", "--artifact-dir", ARTIFACT)),
    Sample("prune-verified", ("prune-verified", "--paths", ARTIFACT)),
    Sample("restore", ("restore", "--artifact-dir", ARTIFACT)),
    Sample("status", ("status", "runs")),
    Sample("ls", ("ls", f"s3://{BUCKET}/myproj")),
    Sample("fetch", ("fetch", "--artifact-uri", URI, "--dst", "stage")),
    # a training job's guard: a step-0 restart over the committed (model and optimizer only) artifact
    Sample("resume-check-refused", ("resume-check", "--attempt-dir", f"runs/{RUN}"), exit=1),
)


# ------------------------------------------------------------------------------------------- normalise


def _in_column(label: str, pattern: str, placeholder: str) -> Callable[[str], str]:
    """Replaces ``pattern`` in the column headed ``label`` of an aligned table (a header line indented by
    two spaces, rows likewise, run headings between them) and realigns the columns to its right: the
    column is as wide as its widest cell after the replacement, as the table's renderer would make it."""
    regex = re.compile(pattern)

    def apply(text: str) -> str:
        lines = text.split("\n")
        for h, header in enumerate(lines):
            found = re.search(rf"(?<=  ){re.escape(label)}( +)\S", header) if header.startswith("  ") else None
            if not found:
                continue
            start, end = found.start(), found.end() - 1  # the column and its gap: [start, end)
            grid = [h]
            for i in range(h + 1, len(lines)):
                if not lines[i] or (not lines[i].startswith("  ") and " " in lines[i]):
                    break  # a blank line or the summary ends the table; run headings have no space
                if lines[i].startswith("  ") and len(lines[i]) > end and lines[i][end - 2 : end] == "  ":
                    grid.append(i)
            cells = {i: regex.sub(placeholder, lines[i][start:end].rstrip()) for i in grid}
            width = max(len(cell) for cell in cells.values())
            for i, cell in cells.items():
                lines[i] = lines[i][:start] + cell.ljust(width) + "  " + lines[i][end:]
        return "\n".join(lines)

    return apply


def _sub(pattern: str, placeholder: str) -> Callable[[str], str]:
    regex = re.compile(pattern, re.MULTILINE)
    return lambda text: regex.sub(placeholder, text)


# Applied in this order to every sample, after the run's own paths and bucket (``normalise``).
PLACEHOLDERS: tuple[Callable[[str], str], ...] = (
    _sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>"),  # the S3 endpoint: a free port drawn at start
    _sub(r"\b[0-9a-f]{64}\b", "<sha256>"),  # a record keyed by a digest of the endpoint (probe)
    _sub(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "YYYY-MM-DDTHH:MM:SSZ"),  # same width: tables stay aligned
    _sub(r"\b\d{4}-\d\d-\d\d \d\d:\d\d\b", "YYYY-MM-DD HH:MM"),  # ls's PUBLISHED UTC
    _in_column("ARCHIVE", r"\b(\d+[smhd] ago|just now)", "<age> ago"),  # status: the verification's age
    _sub(r"^(  took +).*$", r"\1<duration>"),  # every summary's last row
    _sub(r"\b\d+(\.\d+)? ?[KMGT]?i?B/s\b", "<speed>"),
)


def normalise(text: str, *, workdir: Path, bucket: str) -> str:
    """``text`` with what varies between runs replaced: the working directory by ``$PWD`` (the quick start
    runs in the checkout) and its cache by ``~/.cache/ckptflow`` (the default), the bucket by the quick
    start's, then ``PLACEHOLDERS``; trailing spaces and blank lines dropped."""
    text = text.replace(str(workdir / "cache"), "~/.cache/ckptflow").replace(str(workdir), "$PWD")
    text = re.sub(rf"\b{re.escape(bucket)}\b", BUCKET, text)
    for placeholder in PLACEHOLDERS:
        text = placeholder(text)
    return "\n".join(line.rstrip() for line in text.rstrip("\n").split("\n")) + "\n"


# ------------------------------------------------------------------------------------------- generate


def _run(sample: Sample, workdir: Path, bucket: str) -> str:
    args = tuple(arg.replace(BUCKET, bucket) for arg in sample.args)
    env = {"CKPTFLOW_CREDENTIALS": str(workdir / CREDENTIALS), "CKPTFLOW_BUCKET": bucket,
           "CKPTFLOW_CACHE_DIR": str(workdir / "cache")}
    proc = run_on_terminal(*args, env=env, columns=COLUMNS, cwd=workdir, stderr_terminal=sample.exit != 0)
    if proc.returncode != sample.exit or proc.stderr:
        raise RuntimeError(f"docs example {sample.name}: `ckptflow {' '.join(args)}` exited {proc.returncode}"
                           f"\n{proc.stdout}{proc.stderr}")
    host = socket.gethostname()
    if len(host) > 3 and re.search(rf"\b{re.escape(host)}\b", proc.stdout):  # would differ on another machine
        raise RuntimeError(f"docs example {sample.name}: the output names this host ({host}); add a placeholder "
                           f"for it in PLACEHOLDERS\n{proc.stdout}")
    return normalise(proc.stdout, workdir=workdir, bucket=bucket)


def _life(workdir: Path, bucket: str) -> dict[str, str]:
    write_payloads(workdir / ARTIFACT, shards=1)
    return {f"{sample.name}.txt": _run(sample, workdir, bucket) for sample in SAMPLES}


def generate(credentials: Path | None = None) -> dict[str, str]:
    """Every sample (``<name>.txt`` -> its text), from a fresh working directory and bucket. ``credentials``:
    a running SeaweedFS's credentials file (the tests' server), on which a bucket of this run's own is
    created and removed after; without it a private SeaweedFS is started on free ports and stopped after."""
    workdir = Path(tempfile.mkdtemp(prefix="ckptflow-docs-examples-")).resolve()
    server_root = workdir / CREDENTIALS.parent
    try:
        if credentials is None:
            servers.up(server_root, servers.local_profile(server_root), only="seaweedfs")  # what make s3-up runs
            return _life(workdir, BUCKET)
        bucket = f"ckptflow-{uuid.uuid4().hex[:5]}"  # as long as BUCKET: a line fitted to the terminal stays the same
        server_root.mkdir(parents=True)
        shutil.copyfile(credentials, workdir / CREDENTIALS)
        servers.create_bucket(credentials, bucket)
        try:
            return _life(workdir, bucket)
        finally:
            servers.remove_bucket(credentials, bucket)
    finally:
        if credentials is None:
            servers.down(server_root)
        shutil.rmtree(workdir, ignore_errors=True)


def differ(samples: dict[str, str], examples: Path = EXAMPLES) -> list[str]:
    """The sample files under ``examples`` that are not ``samples`` byte for byte (missing, changed, extra)."""
    committed = {path.name for path in examples.glob("*.txt")} if examples.is_dir() else set()
    return sorted(name for name in committed | set(samples)
                  if name not in samples or name not in committed
                  or (examples / name).read_text(encoding="utf-8") != samples[name])


def write(samples: dict[str, str], examples: Path = EXAMPLES) -> None:
    examples.mkdir(parents=True, exist_ok=True)
    for old in examples.glob("*.txt"):
        if old.name not in samples:
            old.unlink()  # a sample no longer produced
    for name, text in samples.items():
        if not (examples / name).is_file() or (examples / name).read_text(encoding="utf-8") != text:
            (examples / name).write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list the samples that differ from docs/examples/, exit 1")
    args = parser.parse_args(argv)
    samples = generate()
    if args.check:
        for name in differ(samples):
            sys.stderr.write(f"docs/examples/{name} is not what the verbs print today; {REGENERATE}\n")
        return 1 if differ(samples) else 0
    write(samples)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
