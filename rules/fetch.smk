# The output is the step report, not .staged.json: that record is how fetch knows the stage is its own,
# and Snakemake deletes a declared output before a rerun and after a failure.
rule fetch:
    output:
        report=f"{REPORTS}/fetch/{{run}}/{{iteration}}.json",
    log:
        f"{LOGS}/fetch/{{run}}/{{iteration}}.log",
    conda:
        "../environment.yml"
    # Credentials are read from the config by the script: where the keys live is not the request.
    params:
        artifact_uri=get_fetch_uri,
        receipt_dir=get_fetch_receipt_dir,
        stage_root=get_stage_root,
    script:
        "../scripts/fetch.py"
