# The outputs are step reports. The param round is the rerun trigger of a restore: the round the report
# records, plus one while a payload file it removed is on disk again (ckptflow.workflow_plan.prune_round),
# so a restored artifact is pending prune again, as a published one is.
rule prune:
    input:
        receipt=get_receipt_input,
        verified=f"{REPORTS}/verify/{{run}}/{{iteration}}.json",
    output:
        report=f"{REPORTS}/prune/{{run}}/{{iteration}}.json",
    log:
        f"{LOGS}/prune/{{run}}/{{iteration}}.log",
    conda:
        "../environment.yml"
    params:
        credentials=config["credentials"],
        round=get_prune_round,
    script:
        "../scripts/prune.py"


rule prune_keep_free:
    input:
        get_all_verify_reports,
    output:
        report=f"{REPORTS}/prune/keep-free.json",
    log:
        f"{LOGS}/prune/keep-free.log",
    conda:
        "../environment.yml"
    params:
        credentials=config["credentials"],
        keep_free=config["prune"]["keep_free"],
        keep_newest=config["prune"]["keep_newest"],
        round=get_keep_free_round,
    script:
        "../scripts/prune_keep_free.py"


rule prune_all:
    input:
        get_prune_all_input,
