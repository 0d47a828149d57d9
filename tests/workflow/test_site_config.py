"""The workflow from any working directory: `snakemake -s <checkout>/Snakefile --configfile site.yaml -- TARGET`
with a site file copied from config/site.example.yaml, and the checkout left as it was."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from workflow_helpers import NOTHING, RUN, SNAKEMAKE, copy_workflow

from ckptflow.workflow import config as workflow_config
from helpers import REPO, preloaded
from helpers.artifacts import make_artifact

TEMPLATE = REPO / "config" / "site.example.yaml"
OUTPUT_KEYS = ("runs_root", "reports_dir", "logs_dir", "stage_dir", "teachers_dir")


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under root with its size and modification time: what a run may not change."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")}


def _site(path: Path, **values) -> Path:
    site = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    site.update(values)
    path.write_text(yaml.safe_dump(site), encoding="utf-8")
    return path


def test_the_site_config_template_names_known_keys_and_every_output_directory():
    site = yaml.safe_load(TEMPLATE.read_text(encoding="utf-8"))
    defaults = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    assert set(site) <= set(defaults)
    assert set(OUTPUT_KEYS) <= set(site)
    workflow_config.checked_config({**defaults, **site})  # valid as it stands


def test_the_workflows_default_output_directories_are_ignored_by_git():
    defaults = yaml.safe_load((REPO / "config" / "config.yaml").read_text(encoding="utf-8"))
    paths = [f"{defaults[key]}/anything" for key in OUTPUT_KEYS]
    done = subprocess.run(["git", "-C", str(REPO), "check-ignore", "--no-index", *paths], capture_output=True,
                          text=True)
    assert sorted(done.stdout.split()) == sorted(paths), done.stdout + done.stderr


@pytest.mark.slow
def test_the_workflow_runs_from_another_directory_with_a_site_config_and_writes_nothing_into_the_checkout(
        tmp_path: Path):
    checkout = copy_workflow(tmp_path / "checkout")  # the operator's checkout, as the repository holds it
    before = _tree(checkout)
    work, archive = tmp_path / "work", tmp_path / "archive"
    art = make_artifact(work / "runs" / RUN)
    archive.mkdir()
    # Relative paths, read against the working directory.
    site = _site(work / "site.yaml", runs_root="runs", bucket=f"file://{archive}", credentials=None,
                 reports_dir="reports", logs_dir="logs", stage_dir="stage", teachers_dir="teachers")
    env = {**os.environ, "CKPTFLOW_CACHE_DIR": str(tmp_path / "cache"), "CKPTFLOW_PROGRESS": "0"}

    def snakemake(*args: str) -> subprocess.CompletedProcess:  # started in ``work`` (forked: tests/helpers/preloaded.py)
        return preloaded.snakemake([str(SNAKEMAKE), "-s", str(checkout / "Snakefile"), *args], env=env, cwd=work)

    run = snakemake("--configfile", site.name, "--", "publish_all")
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{checkout / 'config' / 'config.yaml'} is extended" in run.stdout + run.stderr  # the defaults, then the site's
    assert (art / ".uploaded").is_file()
    assert (work / "reports").is_dir() and (work / "logs").is_dir() and (work / ".snakemake").is_dir()
    assert list(archive.rglob(".posttrain-archive.json"))
    # The targets first is the other spelling that keeps them out of --configfile's list.
    again = snakemake("-n", "publish_all", "--configfile", site.name)
    assert again.returncode == 0 and NOTHING in again.stdout + again.stderr, again.stdout + again.stderr
    # Without `--`, the target is read as a second configuration file: an error naming it, never a run of
    # the default target.
    swallowed = snakemake("-n", "--configfile", site.name, "publish_all")
    out = swallowed.stdout + swallowed.stderr
    assert swallowed.returncode != 0 and "No such file or directory: 'publish_all'" in out, out
    assert _tree(checkout) == before


def test_the_tracked_slurm_profile_names_no_account_or_partition_and_the_site_template_does():
    tracked = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text(encoding="utf-8"))
    resources = [tracked.get("default-resources", {}), *tracked.get("set-resources", {}).values()]
    assert not any({"slurm_account", "slurm_partition"} & set(r) for r in resources), resources
    site = yaml.safe_load((REPO / "profiles" / "slurm-site.example.yaml").read_text(encoding="utf-8"))
    # A later --profile replaces default-resources whole: the template carries the tracked values too.
    assert site["default-resources"] == {**tracked["default-resources"], "slurm_account": "my-account",
                                         "slurm_partition": "my-partition"}


def test_the_slurm_profile_s_rates_and_waits_are_what_snakemake_applies_under_the_workflow_profile(tmp_path):
    """Snakemake layers profiles/default (the workflow profile) over every --profile, key by key: what its
    own argument parsing makes of the documented command line is the cluster profile's values."""
    from snakemake.cli import parse_args

    from helpers import slurm

    tracked = yaml.safe_load((REPO / "profiles" / "slurm" / "config.yaml").read_text(encoding="utf-8"))
    site = slurm.site_profile(tmp_path)
    _, args = parse_args(["-s", str(REPO / "Snakefile"), "--profile", str(REPO / "profiles" / "slurm"),
                          "--profile", str(site), "publish_all"])
    # Snakemake 9 takes the submission rate from max-jobs-per-timespan (default 100/1s), not max-jobs-per-second.
    rate = args.max_jobs_per_timespan
    assert (rate.max_jobs, rate.timespan) == (20, 1) and tracked["max-status-checks-per-second"] == 1
    for key in ("max-status-checks-per-second", "latency-wait", "jobs", "cores", "keep-going", "force-use-threads"):
        assert getattr(args, key.replace("-", "_")) == tracked[key], key
    assert "groups" not in tracked and "group-components" not in tracked  # batch jobs instead


@pytest.mark.parametrize("pending, most", [(1, 20), (9, 20), (10, 20), (200, 20), (1000, 20), (5000, 20), (200, 2),
                                           (1000, 2), (37, 3)])
def test_a_backlog_is_spread_over_at_most_the_jobs_in_flight_in_batches_of_10_to_100(pending, most):
    from ckptflow.workflow.batches import batch_sizes

    sizes = batch_sizes(pending, most)
    assert sum(sizes) == pending and max(sizes) - min(sizes) <= 1
    assert max(sizes) <= 100 and (len(sizes) == 1 or min(sizes) >= 10), sizes
    assert len(sizes) <= most or max(sizes) >= 99, sizes  # more jobs only when 100 each is not enough
