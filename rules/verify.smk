localrules:
    verify,


# verify is a local job: the verification runs in its batch job (verify_batch), or in this job when it
# has none (see ckptflow.workflow.plan, batches).
rule verify:
    input:
        get_receipt_input,
        batch=get_member_batch("verify"),
    output:
        report=f"{REPORTS}/verify/{{run}}/{{iteration}}.json",
    log:
        f"{LOGS}/verify/{{run}}/{{iteration}}.log",
    params:
        credentials=config["credentials"],
    run:
        member_rule(
            "verify",
            wildcards,
            input,
            output,
            log,
            config,
        )


rule verify_batch:
    input:
        unpack(get_batch_inputs("verify")),
    output:
        outcomes=temp(f"{REPORTS}/batches/verify/{{batch}}.json"),
    log:
        f"{LOGS}/batches/verify/{{batch}}.log",
    wildcard_constraints:
        batch=r"[0-9a-f]{16}",
    conda:
        "../environment.yml"
    resources:
        runtime=get_batch_runtime("verify"),
    script:
        "../scripts/batch.py"


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
