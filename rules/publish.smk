rule publish:
    input:
        manifest=f"{ARTIFACT}/{MANIFEST}",
    output:
        receipt=f"{ARTIFACT}/.uploaded",
    log:
        f"{LOGS}/publish/{{run}}/{{iteration}}.log",
    conda:
        "../environment.yml"
    params:
        artifact_dir=get_artifact_dir,
        upload_prefix=get_upload_prefix,
        bucket=config["bucket"],
        credentials=config["credentials"],
    script:
        "../scripts/publish.py"


rule publish_all:
    input:
        get_all_receipts,
