rule publish:
    input:
        manifest=f"{ARTIFACT}/{MANIFEST}",
    output:
        receipt=f"{ARTIFACT}/.uploaded",
    log:
        f"{LOGS}/publish/{{run}}/{{iteration}}.log",
    conda:
        "../environment.yml"
    # The destination (bucket, credentials) is read from the config by the script, not passed as params:
    # params are rerun triggers, and a rerun makes Snakemake delete the receipt first. Re-spelling the
    # bucket, or pointing new publications elsewhere, must not re-publish artifacts that already hold a
    # receipt (their payloads may be pruned). Any rerun that does happen re-derives the receipt: publish
    # adopts the identical committed archive from the local manifest's digests.
    params:
        artifact_dir=get_artifact_dir,
        upload_prefix=get_upload_prefix,
    script:
        "../scripts/publish.py"


rule publish_all:
    input:
        get_all_receipts,
