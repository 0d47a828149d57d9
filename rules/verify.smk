rule verify:
    input:
        get_receipt_input,
    output:
        report=f"{REPORTS}/verify/{{run}}/{{iteration}}.json",
    log:
        f"{LOGS}/verify/{{run}}/{{iteration}}.log",
    conda:
        "../environment.yml"
    params:
        credentials=config["credentials"],
    script:
        "../scripts/verify.py"


rule verify_all:
    input:
        get_all_verify_reports,
