# The output is the step report, not .merge-complete.json: Snakemake deletes a declared output before a
# rerun and after a failure, and without its record the merge could no longer tell a completed merge of
# another request (refused unless the recipe says force) from its own interrupted one.
rule merge:
    input:
        experts=get_merge_experts,
    output:
        report=f"{REPORTS}/merge/{{run}}/{{iteration}}.json",
    log:
        f"{LOGS}/merge/{{run}}/{{iteration}}.log",
    conda:
        "../environment.yml"
    params:
        artifact_dir=get_artifact_dir,
        recipe=get_merge_recipe,
        iteration=iteration_of,
    script:
        "../scripts/merge.py"


rule merge_experts:
    input:
        get_merge_target,
