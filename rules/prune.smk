# The outputs are step reports. The param round is the rerun trigger of a restore: the round the report
# records, plus one while a payload file gone when it finished is on disk again, whatever freed it
# (ckptflow.workflow.triggers.prune_round), so a restored artifact is pending prune again, as a published one is.
localrules:
    prune,


# prune is a local job: the prune runs in its batch job (prune_batch), or in this job when it has none
# (see ckptflow.workflow.plan, batches).
rule prune:
    input:
        receipt=get_receipt_input,
        verified=f"{REPORTS}/verify/{{run}}/{{iteration}}.json",
        batch=get_member_batch("prune"),
    output:
        report=f"{REPORTS}/prune/{{run}}/{{iteration}}.json",
    log:
        f"{LOGS}/prune/{{run}}/{{iteration}}.log",
    params:
        credentials=config["credentials"],
        round=get_prune_round,
    run:
        member_rule("prune", wildcards, input, output, log, config, round=params.round)


rule prune_batch:
    input:
        unpack(get_batch_inputs("prune")),
    output:
        outcomes=temp(f"{REPORTS}/batches/prune/{{batch}}.json"),
    log:
        f"{LOGS}/batches/prune/{{batch}}.log",
    wildcard_constraints:
        batch=r"[0-9a-f]{16}",
    conda:
        "../environment.yml"
    resources:
        runtime=get_batch_runtime("prune"),
    script:
        "../scripts/batch.py"


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
