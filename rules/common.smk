from snakemake.utils import validate

validate(config, schema="../schemas/config.schema.json")

RUNS = config["runs_root"].rstrip("/")
REPORTS = config["reports_dir"].rstrip("/")
LOGS = config["logs_dir"].rstrip("/")
ARTIFACT = f"{RUNS}/{{run}}/checkpoint_artifacts/{{iteration}}"
MANIFEST = ".posttrain-checkpoint-artifact.json"


wildcard_constraints:
    iteration=r"iter_[0-9]+",


def committed_artifacts():
    """(run, iteration) of every artifact whose native manifest is committed."""
    found = glob_wildcards(f"{ARTIFACT}/{MANIFEST}")
    return sorted(set(zip(found.run, found.iteration)))


def get_all_receipts(wildcards):
    return [
        f"{RUNS}/{run}/checkpoint_artifacts/{it}/.uploaded"
        for run, it in committed_artifacts()
    ]


def get_all_verify_reports(wildcards):
    return [f"{REPORTS}/verify/{run}/{it}.json" for run, it in committed_artifacts()]


def get_all_prune_reports(wildcards):
    return [f"{REPORTS}/prune/{run}/{it}.json" for run, it in committed_artifacts()]


def get_upload_prefix(wildcards):
    return f"{wildcards.run}/checkpoints"


def get_artifact_dir(wildcards):
    return f"{RUNS}/{wildcards.run}/checkpoint_artifacts/{wildcards.iteration}"
