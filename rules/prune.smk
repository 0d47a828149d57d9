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
    script:
        "../scripts/prune.py"


rule prune_all:
    input:
        get_all_prune_reports,
