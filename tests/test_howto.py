"""The how-to pages (docs/how-to/) are commands to copy, so every command they show is checked here.

A ``ckptflow`` line (``$ ckptflow ...`` in a fenced block) must be exactly one of the docs examples'
``SAMPLES`` (tests/helpers/docs_examples.py) followed by nothing but that sample's include, so what it
prints is the sample ``tests/test_docs_examples.py`` holds to a real run. Every other command runs here as
written, in a fresh working directory (``examples/`` and ``demo/`` linked from the checkout, which is where
the pages run them), with the output a page shows compared with what it printed: the training job and its
requeue after a kill, the Hugging Face example on the demo's offline base, the workflow for a runs root
from another directory with a site file, and the Slurm first run's copies and dry run (which needs no
Slurm daemon). The sbatch scripts (the scrub job, the training job that Slurm requeues on the Slurm page)
and the scrub's crontab line are checked for syntax (``bash -n``), and the first run's other lines for
syntax and for the checkout files they name: the real run and ``sacct`` need a cluster
(``tests/workflow/test_slurm*.py`` run the same profiles on the single-node Slurm, and
``tests/workflow/test_slurm_requeue.py`` submits the training job's script and requeues it)."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ckptflow.artifact import ComponentSpec, seal_artifact
from helpers import REPO, docs_examples
from helpers.artifacts import write_payloads
from helpers.markdown import fenced

HOWTO = REPO / "docs" / "how-to"
PAGES = sorted(HOWTO.glob("*.md"))
BIN = Path(sys.executable).parent
# The pages whose non-ckptflow commands a test below runs (or, for Slurm, checks): name -> the test.
RUN_BY = {
    "training-job.md": "test_the_training_job_and_its_requeue_run_as_written",
    "hugging-face.md": "test_the_hugging_face_example_runs_as_written_on_the_offline_base",
    "workflow.md": "test_the_workflow_for_a_runs_root_runs_as_written_from_another_directory",
    "slurm-first-run.md": "test_the_slurm_first_runs_dry_run_plans_and_the_scripts_and_cron_line_parse",
}


@dataclass(frozen=True)
class Command:
    """A ``$ `` line of a fenced block and the lines after it up to the next one or the block's end."""

    page: str
    line: str
    output: tuple[str, ...]


def commands(page: Path) -> list[Command]:
    found = []
    for _, lines in fenced(page.read_text(encoding="utf-8")):
        for i, line in enumerate(lines):
            if line.startswith("$ "):
                end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("$ ")), len(lines))
                found.append(Command(page.name, line[2:], tuple(lines[i + 1 : end])))
    return found


def others(name: str) -> list[Command]:
    return [c for c in commands(HOWTO / name) if not c.line.startswith("ckptflow ")]


def expected(shown: tuple[str, ...], workdir: Path) -> re.Pattern:
    """A page's shown output as one pattern: ``$PWD`` is the working directory, ``<...>`` any word."""
    parts = [re.escape(line.replace("$PWD", str(workdir))) for line in shown]  # re.escape leaves < and > alone
    return re.compile("\n".join(re.sub(r"<[a-z]+>", r"\\S+", part) for part in parts))


def run_lines(lines: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Each line in ``bash -c`` in ``cwd``, one after another, as a person pastes them (its own process
    group, killed whole on a timeout)."""
    done = []
    for line in lines:
        proc = subprocess.Popen(["bash", "-c", line], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
        done.append(subprocess.CompletedProcess(line, proc.returncode, out, err))
    return done


def workdir_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "CKPTFLOW_PROGRESS": "0",
            "OMP_NUM_THREADS": "1", **extra}


def linked(tmp_path: Path, *names: str) -> Path:
    for name in names:
        (tmp_path / name).symlink_to(REPO / name)
    return tmp_path


# ------------------------------------------------------------------------------------------- the pages


def test_the_how_to_section_lists_every_page_and_each_page_is_run_or_shows_only_samples():
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    [section] = [entry["How-to"] for entry in nav if isinstance(entry, dict) and "How-to" in entry]
    listed = sorted(Path(next(iter(entry.values()))).name for entry in section)
    assert listed == [page.name for page in PAGES]
    for page in PAGES:
        if others(page.name):
            assert page.name in RUN_BY, f"docs/how-to/{page.name}: its commands are run by no test"


def test_every_ckptflow_line_is_a_sample_followed_by_its_output():
    samples = {sample.args: sample.name for sample in docs_examples.SAMPLES}
    shown = [c for page in PAGES for c in commands(page) if c.line.startswith("ckptflow ")]
    assert len(shown) >= 15
    for command in shown:
        args = tuple(shlex.split(command.line)[1:])
        assert args in samples, (f"docs/how-to/{command.page}: `{command.line}` is no sample of "
                                 "tests/helpers/docs_examples.py: add it to SAMPLES or show one of them")
        assert command.output == (f'--8<-- "examples/{samples[args]}.txt"',), (
            f"docs/how-to/{command.page}: `{command.line}` must be followed by its sample's include alone")


def test_the_slurm_first_runs_dry_run_plans_and_the_scripts_and_cron_line_parse(tmp_path):
    scripts = [lines for page in [*PAGES, REPO / "docs" / "slurm.md"]
               for lang, lines in fenced(page.read_text(encoding="utf-8"))
               if lang == "bash" and lines and lines[0] == "#!/bin/bash"]
    assert len(scripts) >= 2  # the scrub job (how-to) and the training job that Slurm requeues (slurm.md)
    for lines in scripts:
        script = tmp_path / "job.sbatch"
        script.write_text("\n".join(lines) + "\n", encoding="utf-8")
        checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=60)
        assert checked.returncode == 0, checked.stderr + "\n".join(lines)
        assert all(re.fullmatch(r"#SBATCH --[a-z-]+(=\S+)?", line) for line in lines if line.startswith("#SBATCH"))
    [requeued] = [lines for lines in scripts if "#SBATCH --requeue" in lines]
    assert any("--run-dir" in line and "$RUN_TS" in line for line in requeued)  # the same <ts> every start
    cron = [line for lang, lines in fenced((HOWTO / "scrub.md").read_text(encoding="utf-8")) if lang == "text"
            for line in lines if re.match(r"[\d*]", line)]
    assert cron, "docs/how-to/scrub.md: no crontab line"
    for line in cron:
        fields = line.split(None, 5)
        assert all(re.fullmatch(r"\*|\d+(-\d+)?(,\d+(-\d+)?)*(/\d+)?", field) for field in fields[:5]), line
        command = fields[5]
        assert not re.search(r"(?<!\\)%", command), f"an unescaped % ends a crontab command: {line}"
        checked = subprocess.run(["bash", "-n", "-c", command.replace("\\%", "%")], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
    lines = [c.line for c in others("slurm-first-run.md")]
    assert lines[0].startswith("C=") and lines[1] == "export PATH=$C/.venv/bin:$PATH"
    for line in lines[1:]:
        checked = subprocess.run(["bash", "-n", "-c", line], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
        for path in re.findall(r"\$C/(\S+)", line):
            assert path == ".venv/bin:$PATH" or (REPO / path).exists(), f"{line}: the checkout has no {path}"
    assert sum("--profile $C/profiles/slurm --profile ~/ckptflow-slurm.yaml" in line for line in lines) == 2
    # The copies, then the dry run, which needs no Slurm daemon: with both profiles and the site file filled in
    # (a runs root holding one sealed artifact, a file:// archive), it plans and submits nothing.
    home, runs = tmp_path / "home", tmp_path / "runs"
    home.mkdir()
    art = write_payloads(runs / docs_examples.RUN / "checkpoint_artifacts" / "iter_000100", model_bytes=1000, shards=1)
    seal_artifact(art, 100, [ComponentSpec("model", "model.pt"), ComponentSpec("optim", "optim")], progress=False)
    env = workdir_env(HOME=str(home), C=str(REPO), CKPTFLOW_CACHE_DIR=str(tmp_path / "cache"))
    copies = run_lines([f"{lines[1]} && {line}" for line in lines[2:5]], tmp_path, env)
    assert [proc.returncode for proc in copies] == [0, 0, 0], [proc.stderr for proc in copies]
    assert [c.line.split()[0] for c in others("slurm-first-run.md")[2:5]] == ["cp", "cp", "chmod"]
    site = yaml.safe_load((home / "ckptflow-site.yaml").read_text(encoding="utf-8"))
    site.update(runs_root=str(runs), bucket=f"file://{tmp_path / 'archive'}", credentials=None,
                **{key: str(tmp_path / "out" / key) for key in ("reports_dir", "logs_dir", "stage_dir", "teachers_dir")})
    (home / "ckptflow-site.yaml").write_text(yaml.safe_dump(site), encoding="utf-8")
    [dry] = [c for c in others("slurm-first-run.md") if " -n -- " in c.line]
    [planned] = run_lines([f"{lines[1]} && {dry.line}"], tmp_path, env)
    printed = planned.stdout + planned.stderr
    assert planned.returncode == 0, printed
    assert all(expected((line,), tmp_path).search(printed) for line in dry.output if line != "..."), printed
    assert "prune_batch" in printed and not (tmp_path / "archive").exists()


@pytest.mark.slow
def test_the_training_job_and_its_requeue_run_as_written(tmp_path):
    workdir = linked(tmp_path, "examples")
    shown = others("training-job.md")
    assert [c.line.split()[0] for c in shown] == ["mkdir", "CKPTFLOW_TEST_KILL_AT=trainer:after-save", "torchrun"]
    killed, requeue = shown[1:]
    assert killed.line.split(None, 1)[1] == requeue.line  # the requeue is the same command
    mkdir, killed_run, requeued = run_lines([c.line for c in shown], workdir, workdir_env())
    assert mkdir.returncode == 0
    assert killed_run.returncode == 1 and "exitcode  : -9" in killed_run.stderr, killed_run.stderr
    run_dir = workdir / "runs" / "myproj" / "sft" / "run2" / "20261203T120000Z"
    assert (run_dir / "checkpoint_artifacts" / "iter_000002" / ".posttrain-checkpoint-artifact.json").is_file()
    assert requeued.returncode == 0, requeued.stderr
    assert expected(requeue.output, workdir).fullmatch(requeued.stdout.rstrip("\n")), (
        f"docs/how-to/training-job.md: the requeue printed\n{requeued.stdout}")
    for it in (2, 4, 6):
        assert (run_dir / "checkpoint_artifacts" / f"iter_{it:06d}" / ".uploaded").is_file()


@pytest.mark.slow
def test_the_hugging_face_example_runs_as_written_on_the_offline_base(tmp_path):
    workdir = linked(tmp_path, "examples", "demo")
    shown = others("hugging-face.md")
    assert [c.line.split()[:2] for c in shown] == [["python", "demo/build_run.py"], ["mkdir", "-p"],
                                                  ["python", "examples/train_hf_trainer.py"],
                                                  ["torchrun", "--nproc-per-node"]]
    assert not any(c.output for c in shown)
    built, made, trained, sft = run_lines([c.line for c in shown], workdir, workdir_env())
    assert built.returncode == 0 and made.returncode == 0, built.stderr + made.stderr
    assert trained.returncode == 0, trained.stderr
    result = json.loads(trained.stdout.strip().splitlines()[-1])
    text = (HOWTO / "hugging-face.md").read_text(encoding="utf-8")
    assert result["resumed_from"] is None and result["exported"] == [2, 4] and not result["failed"]
    assert result["published"] == ["iter_000002", "iter_000004"] and "(`iter_000002` and `iter_000004` published)" in text
    # TRL's SFTTrainer, LoRA, two ranks: one JSON line (the main process's), the same two iterations, each
    # artifact the adapters and the Trainer's full state, resumable as the resume guard judges it
    assert sft.returncode == 0, sft.stderr[-4000:]
    [line] = [line for line in sft.stdout.splitlines() if line.startswith('{"')]  # the Trainer's logs are dict reprs
    lora = json.loads(line)
    assert lora["exported"] == [2, 4] and lora["published"] == ["iter_000002", "iter_000004"] and not lora["failed"]
    run = workdir / shown[3].line.split("--run-dir ")[1].split()[0]
    from ckptflow.records import read_manifest
    from ckptflow.trainer.resume import check_run_attempt

    for it in (2, 4):
        names = {f.path for f in read_manifest(run / "checkpoint_artifacts" / f"iter_{it:06d}").physical_files()}
        assert {"adapter_model.safetensors", "adapter_config.json", "optimizer.pt", "scheduler.pt",
                "rng_state_0.pth", "rng_state_1.pth", "trainer_state.json"} <= names, names
    decision = check_run_attempt(run, "auto")
    assert (decision.decision, decision.resume_iteration) == ("resume", 4), decision
    tensors = json.loads((workdir / "demo-run" / "base" / "model.safetensors.index.json").read_text())["weight_map"]
    assert f"That base has {len(tensors)} tensors" in text and f"--min-tensors {len(tensors)}`" in text


@pytest.mark.slow
@pytest.mark.seaweedfs
def test_the_workflow_for_a_runs_root_runs_as_written_from_another_directory(tmp_path, seaweedfs_bucket,
                                                                            seaweedfs_credentials_path):
    page = (HOWTO / "workflow.md").read_text(encoding="utf-8")
    [site] = [lines for lang, lines in fenced(page) if lang == "yaml"]
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "site.yaml").write_text("\n".join(site) + "\n", encoding="utf-8")
    for it in (100, 200):  # the quick start's runs/: artifacts of one run, sealed as its seal sample does
        art = write_payloads(workdir / "runs" / docs_examples.RUN / "checkpoint_artifacts" / f"iter_{it:06d}",
                             model_bytes=1000, shards=1, seed=it)
        seal_artifact(art, it, [ComponentSpec("model", "model.pt"), ComponentSpec("optim", "optim")], progress=False)
    shown = others("workflow.md")
    assert shown[0].line.startswith("C=") and not shown[0].output  # the checkout: this one
    env = workdir_env(C=str(REPO), CKPTFLOW_BUCKET=seaweedfs_bucket,
                      CKPTFLOW_CREDENTIALS=str(seaweedfs_credentials_path), CKPTFLOW_CACHE_DIR=str(tmp_path / "cache"))
    script = [c.line for c in shown[1:]]
    assert script[0] == "export PATH=$C/.venv/bin:$PATH" and all(line.startswith("snakemake -s $C/Snakefile ")
                                                                  for line in script[1:])
    # the export only carries to later lines in one shell: run it before each of them
    done = run_lines([f"{script[0]} && {line}" for line in script[1:]], workdir, env)
    for command, proc in zip(shown[2:], done, strict=True):
        printed = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"{command.line}\n{printed}"
        lines = [line for line in command.output if line != "..."]
        assert all(expected((line,), workdir).search(printed) for line in lines), f"{command.line}\n{printed}"
    for it in (100, 200):
        art = workdir / "runs" / docs_examples.RUN / "checkpoint_artifacts" / f"iter_{it:06d}"
        assert (art / ".uploaded").is_file() and not (art / "model.pt").exists()  # published, verified, pruned
        assert (workdir / "reports" / "prune" / docs_examples.RUN / f"iter_{it:06d}.json").is_file()
