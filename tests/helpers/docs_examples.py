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

After the quick start's verbs, the others run there too, so every verb's reference page shows a real run
(``docs_pages`` includes each verb's first sample above its option table, and refuses a verb without one):
``repair-part-digests`` and ``gc-uploads`` dry runs on the published artifact, ``retain-checkpoints`` over an
earlier attempt's full checkpoints, and ``merge`` of two experts of the tiny Qwen3 base
(``tiny_models``) into a new run's artifact, then ``materialize`` of its teacher. Last come the how-to pages'
(``docs/how-to/``, whose ``ckptflow`` lines ``tests/test_howto.py`` holds to these samples): a scrub of one
slice and of the whole runs root, ``prune-verified --keep-free`` once a later iteration of the run
(``SECOND``) is sealed and published too, and a fetch into another directory.

The workflow's checks before planning are shown the same way (``CONFIG_ERRORS``): in that working
directory, once another checkpoint is sealed there (``iter_000200``, not published), with a site file
copied from ``config/site.example.yaml`` (relative directories, no bucket, no credentials, neither in the
environment), the real ``snakemake -n`` of the checkout's ``Snakefile`` is refused before it plans, and
``config-errors.txt`` holds each command line (as a user types it there) and the one ``ckptflow: ...``
line it printed. The README shows one sample too, ``publish.txt``, between two HTML comments
(``README_BEGIN``, ``README_END``); ``readme`` rewrites that block from the sample.

    python tests/helpers/docs_examples.py            # make docs-examples: rewrites docs/examples/ and README.md's sample
    python tests/helpers/docs_examples.py --check    # lists what differs (samples, README.md), exit 1

Both start a SeaweedFS of their own on free loopback ports (``servers.py``'s ``local`` profile, the one
``make s3-up`` starts, under a temporary directory) and stop it by its PID. ``tests/test_docs_examples.py``
runs the same ``generate`` on the running test server instead (a bucket of its own) and compares. The pages
include the files with ``pymdownx.snippets`` (``--8<-- "examples/publish.txt"`` inside a fenced block), so a
verb whose output changes fails that test until this is run again and the files committed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: tests/ holds the helpers

import yaml

from helpers import REPO, preloaded, servers
from helpers.artifacts import make_artifact, write_payloads
from helpers.cli import run_on_terminal

EXAMPLES = REPO / "docs" / "examples"
README = REPO / "README.md"
REGENERATE = "run `make docs-examples` (python tests/helpers/docs_examples.py) and commit docs/examples/ and README.md"

# The quick start's names: the user's bucket (make s3-up's), run, artifact and probe prefix.
BUCKET = "ckptflow-local"
RUN = "myproj/sft/run1/20261201T120000Z"
MERGED = "myproj/merge/avg1/20261202T120000Z"
EARLIER = "myproj/sft/run1/20261130T120000Z"  # an earlier attempt of the run, with full checkpoints only
ARTIFACT = f"runs/{RUN}/checkpoint_artifacts/iter_000100"
URI = f"s3://{BUCKET}/{RUN}/checkpoint_artifacts/iter_000100"
SECOND = f"runs/{RUN}/checkpoint_artifacts/iter_000150"  # a later iteration, sealed and published before SECOND_BEFORE
SECOND_BEFORE = "prune-keep-free"
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
    Sample("repair-part-digests", ("repair-part-digests", "--artifact-dir", ARTIFACT, "--dry-run")),
    Sample("gc-uploads", ("gc-uploads", "--prefix", "myproj/sft/run1", "--dry-run")),
    # an earlier attempt's full checkpoints (checkpoints/iter_N with trainer.pt, none uploaded): nothing may go
    Sample("retain-checkpoints", ("retain-checkpoints", "--run-dir", f"runs/{EARLIER}", "--keep-last", "1", "--dry-run")),
    # two experts of the tiny base (``tiny_models``), averaged into a new run's artifact, then its teacher (a
    # 24-tensor model: --min-tensors lowers the floor meant for real models)
    Sample("merge", ("merge", "--mode", "avg", "--experts", "experts/a/model.pt,experts/b/model.pt",
                     "--out", f"runs/{MERGED}/checkpoint_artifacts/iter_000300/model.pt")),
    Sample("materialize", ("materialize", "--ckpt-dir", f"runs/{MERGED}/checkpoint_artifacts/iter_000300",
                           "--base", "base", "--out", "teachers/merged-iter_000300", "--min-tensors", "20")),
    # the how-to pages' (docs/how-to/): a scrub's slice and a whole runs root's, freeing disk until a floor
    # of free space is reached (a dry run, once a later iteration of the run is published too: SECOND; the
    # newest artifact of each run stays), a fetch into another machine's directory
    Sample("verify-subset", ("verify", "--artifact-dir", ARTIFACT, "--read-data", "--subset", "1/7")),
    Sample("verify-all-under", ("verify", "--all-under", "runs")),
    Sample("prune-keep-free", ("prune-verified", "--runs-root", "runs", "--keep-free", "100%", "--dry-run")),
    Sample("fetch-elsewhere", ("fetch", "--artifact-uri", URI, "--dst", "elsewhere/stage")),
)


# The workflow's checks before planning: each a dry run from the quick start's working directory, once its
# run holds a third committed iteration, iter_000200, not yet published (and iter_000100 and SECOND, published),
# with the site file SITE there, refused before Snakemake plans a job.
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
SITE = "site.yaml"
CONFIG_ERRORS = (
    ("--config", "bucekt=s3://my-checkpoints", "--", "publish_all"),  # a misspelt key
    ("--", "publish_all"),  # the site file names no bucket, nor does CKPTFLOW_BUCKET
    ("--", "merge_experts"),  # a target that acts on one iteration, without iter
)
CONFIG_ERRORS_FILE = "config-errors.txt"

# README.md's one sample: the fenced block between these two lines is docs/examples/README_SAMPLE.
README_SAMPLE = "publish.txt"
README_BEGIN = f"<!-- {README_SAMPLE}: written by `make docs-examples` from docs/examples/{README_SAMPLE} -->"
README_END = f"<!-- end of docs/examples/{README_SAMPLE} -->"


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
    _sub(r"\b\d+(\.\d+)? [KMGT]?i?B free and would have \d+(\.\d+)? [KMGT]?i?B\b",
         "<size> free and would have <size>"),  # prune-verified --keep-free: the file system's free space
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


def _site(workdir: Path) -> None:
    """``SITE`` in ``workdir``: the template with the runs root and the workflow's directories relative to
    the working directory, and neither bucket nor credentials."""
    site = yaml.safe_load((REPO / "config" / "site.example.yaml").read_text(encoding="utf-8"))
    site.update(runs_root="runs", bucket=None, credentials=None, reports_dir="reports", logs_dir="logs",
                stage_dir="stage", teachers_dir="teachers")
    (workdir / SITE).write_text(yaml.safe_dump(site, sort_keys=False), encoding="utf-8")


def _snakemake(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``argv`` (a Snakemake dry run) in ``cwd``, forked from this process's Snakemake template
    (tests/helpers/preloaded.py) as the workflow tests run it, else started as usual. A dry run runs no
    job, so it is forked without the launcher of script jobs (``preloaded.snakemake`` would first wait
    for the ckptflow templates to import torch)."""
    return preloaded.snakemake_planning(argv, cwd=cwd, env=env)


def _config_errors(workdir: Path) -> str:
    """``CONFIG_ERRORS`` run in ``workdir``: each command line as typed there (``$ snakemake -s
    <checkout>/Snakefile --configfile site.yaml -n ...``) and the one ``ckptflow:`` line it printed."""
    make_artifact(workdir / "runs" / RUN, iteration=200, model_bytes=1000, shards=1)
    _site(workdir)
    env = {**os.environ, "CKPTFLOW_BUCKET": "", "CKPTFLOW_CREDENTIALS": "", "CKPTFLOW_CACHE_DIR": str(workdir / "cache"),
           "CKPTFLOW_PROGRESS": "0"}
    shown = []
    for args in CONFIG_ERRORS:
        typed = ("snakemake", "-s", str(REPO / "Snakefile"), "--configfile", SITE, "-n", *args)
        done = _snakemake([str(SNAKEMAKE), *typed[1:]], workdir, env)
        lines = [line for line in done.stderr.splitlines() if line.startswith("ckptflow: ")]
        if done.returncode != 1 or len(lines) != 1 or "Traceback" in done.stdout + done.stderr:
            raise RuntimeError(f"docs example {CONFIG_ERRORS_FILE}: `{' '.join(typed)}` exited {done.returncode}, "
                               f"not refused in one line\n{done.stdout}{done.stderr}")
        shown += [f"$ {' '.join(typed).replace(str(REPO), '<checkout>')}", lines[0]]
    return "\n".join(shown) + "\n"


def _inputs(workdir: Path) -> None:
    """What the samples after the quick start's read: two full checkpoints of an earlier attempt of the
    run (``trainer.pt`` each) and, for merge and materialize, the tiny Qwen3 base and two experts of it (``torch.save({"net":
    ...})``, what a trainer writes)."""
    from helpers import tiny_models

    for it in (50, 100):
        ckpt = workdir / "runs" / EARLIER / "checkpoints" / f"iter_{it:06d}"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer.pt").write_bytes(b"trainer state")
        (ckpt / "model.pt").write_bytes(bytes(1000))
    base = tiny_models.build_tiny_base("qwen3", workdir / "base")
    state = tiny_models.in_memory_state_dict(base)
    for seed, name in ((1, "a"), (2, "b")):
        (workdir / "experts" / name).mkdir(parents=True)
        tiny_models.save_consolidated(tiny_models.perturbed(state, 0.01, seed), workdir / "experts" / name / "model.pt")


def _second(workdir: Path, bucket: str) -> None:
    """``SECOND`` sealed and published as the quick start did ``ARTIFACT`` (before ``SECOND_BEFORE``): a run
    with two verified artifacts, the older one of which ``--keep-free`` may free."""
    write_payloads(workdir / SECOND, shards=1, seed=1)
    for args in (("seal", "--artifact-dir", SECOND, "--iteration", "150", "model=model.pt", "optim=optim"),
                 ("publish", "--artifact-dir", SECOND)):
        _run(Sample("second", args), workdir, bucket)


def _life(workdir: Path, bucket: str) -> dict[str, str]:
    write_payloads(workdir / ARTIFACT, shards=1)
    _inputs(workdir)
    samples = {}
    for sample in SAMPLES:
        if sample.name == SECOND_BEFORE:
            _second(workdir, bucket)
        samples[f"{sample.name}.txt"] = _run(sample, workdir, bucket)
    samples[CONFIG_ERRORS_FILE] = normalise(_config_errors(workdir), workdir=workdir, bucket=bucket)
    return samples


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


def readme(text: str, sample: str) -> str:
    """README.md's ``text`` with its sample block (the lines between ``README_BEGIN`` and ``README_END``) a
    ``text`` fence holding ``sample``; a README without both markers, once each, is an error."""
    if text.count(f"{README_BEGIN}\n") != 1 or text.count(f"\n{README_END}\n") != 1:
        raise ValueError(f"README.md: the sample block must be enclosed by the lines {README_BEGIN} and {README_END}")
    head, rest = text.split(f"{README_BEGIN}\n")
    _, tail = rest.split(f"\n{README_END}\n")
    return f"{head}{README_BEGIN}\n```text\n{sample}```\n{README_END}\n{tail}"


def write(samples: dict[str, str], examples: Path = EXAMPLES, readme_path: Path = README) -> None:
    examples.mkdir(parents=True, exist_ok=True)
    for old in examples.glob("*.txt"):
        if old.name not in samples:
            old.unlink()  # a sample no longer produced
    for name, text in samples.items():
        if not (examples / name).is_file() or (examples / name).read_text(encoding="utf-8") != text:
            (examples / name).write_text(text, encoding="utf-8")
    current = readme_path.read_text(encoding="utf-8")
    if readme(current, samples[README_SAMPLE]) != current:
        readme_path.write_text(readme(current, samples[README_SAMPLE]), encoding="utf-8")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list the samples (and README.md's) that differ from what the verbs print, exit 1")
    args = parser.parse_args(argv)
    samples = generate()
    if args.check:
        stale = [f"docs/examples/{name}" for name in differ(samples)]
        current = README.read_text(encoding="utf-8")
        if readme(current, samples[README_SAMPLE]) != current:
            stale.append("README.md")
        for name in stale:
            sys.stderr.write(f"{name} is not what the verbs print today; {REGENERATE}\n")
        return 1 if stale else 0
    write(samples)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
