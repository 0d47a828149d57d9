# The output is the step report, not the receipt .uploaded: Snakemake deletes a job's declared outputs
# before it reruns it (a code change, -F, -R, --forcerun), after a failure and on --delete-all-output,
# and a receipt may be the only record of where a pruned artifact's archive lives. publish_all requests
# this report only for committed artifacts without a receipt that belongs to them (the pending view);
# verify and prune take it as their input once it exists. For an artifact whose receipt belongs, the job
# publishes nothing and contacts no store (the report names the receipt's destination). An artifact
# without one is re-derived at a destination its verify, publish or legacy-receipt report names when
# the identical archive is there, else published to the configured bucket.
localrules:
    publish,


# publish is a local job: the artifact's publication runs in its batch job (publish_batch, below), or in
# this job when it has none (see ckptflow.workflow.plan, batches).
rule publish:
    input:
        manifest=f"{ARTIFACT}/{MANIFEST}",
        batch=get_member_batch("publish"),
    output:
        report=f"{REPORTS}/publish/{{run}}/{{iteration}}.json",
    log:
        f"{LOGS}/publish/{{run}}/{{iteration}}.log",
    # The destination (bucket, credentials) is read from the config: re-spelling the bucket or pointing
    # new publications elsewhere must not rerun jobs. The one param is the rerun trigger of a lost
    # receipt: the publication number its report records, plus one while the artifact has no receipt
    # that belongs to it (so the report alone cannot hide a lost receipt).
    params:
        publication=get_publication,
    run:
        member_rule(
            "publish",
            wildcards,
            input,
            output,
            log,
            config,
            publication=params.publication,
        )


# The publications of many artifacts in one process: each artifact's outcome (report or one-line
# error, and its log) goes to this temporary file, which the artifact's own publish job reads.
rule publish_batch:
    input:
        unpack(get_batch_inputs("publish")),
    output:
        outcomes=temp(f"{REPORTS}/batches/publish/{{batch}}.json"),
    log:
        f"{LOGS}/batches/publish/{{batch}}.log",
    wildcard_constraints:
        batch=r"[0-9a-f]{16}",
    conda:
        "../environment.yml"
    resources:
        runtime=get_batch_runtime("publish"),
    script:
        "../scripts/batch.py"


rule publish_all:
    input:
        get_publish_all_input,


# A legacy plain-text .uploaded binds no destination nor digest: publication replaces it by a JSON
# receipt (publish re-derives or adopts the archive), and this report is what marks that done. The
# marker itself is never counted as published: it is not the output of this rule.
rule replace_legacy_receipt:
    input:
        manifest=f"{ARTIFACT}/{MANIFEST}",
    output:
        report=f"{REPORTS}/legacy-receipt/{{run}}/{{iteration}}.json",
    log:
        f"{LOGS}/legacy-receipt/{{run}}/{{iteration}}.log",
    conda:
        "../environment.yml"
    script:
        "../scripts/replace_legacy_receipt.py"
