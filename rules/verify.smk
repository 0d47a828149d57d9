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


# A scrub of every published artifact under runs_root: objects read back and hashed (config scrub_subset:
# one slice). A report, never a record; rerun a slice that already has one with --forcerun scrub.
rule scrub:
    output:
        report=f"{REPORTS}/scrub/{{slice}}.json",
    log:
        f"{LOGS}/scrub/{{slice}}.log",
    wildcard_constraints:
        slice=r"all|[0-9]+-of-[0-9]+",
    conda:
        "../environment.yml"
    params:
        credentials=config["credentials"],
    script:
        "../scripts/scrub.py"


rule scrub_all:
    input:
        get_scrub_report,
