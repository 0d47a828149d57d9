# The output is the step report, never a record: restore reads the manifest and the receipt, and
# Snakemake deletes a declared output before a rerun and after a failure. The artifact directory is the
# input: pruning it (or losing a payload) changes its mtime, so an earlier restore reruns when needed
# (see ckptflow.workflow.triggers.restore_inputs).
rule restore_artifact:
    input:
        get_restore_input,
    output:
        report=f"{REPORTS}/restore/{{run}}/{{iteration}}.json",
    log:
        f"{LOGS}/restore/{{run}}/{{iteration}}.log",
    conda:
        "../environment.yml"
    params:
        credentials=config["credentials"],
    script:
        "../scripts/restore.py"


# snakemake restore --config iter=300 [run=R]: refill that artifact in place.
rule restore:
    input:
        get_restore_target,


# snakemake restore_all [--config run=R]: refill every pruned artifact (of run R, else of every run).
rule restore_all:
    input:
        get_all_restore_reports,
