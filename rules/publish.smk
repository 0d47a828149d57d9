rule publish:
    input:
        manifest=f"{ARTIFACT}/{MANIFEST}",
    output:
        receipt=f"{ARTIFACT}/.uploaded",
    log:
        f"{LOGS}/publish/{{run}}/{{iteration}}.log",
    conda:
        "../environment.yml"
    # No params: the script takes the artifact from its input and the destination (bucket, credentials)
    # from the config. Params are rerun triggers, and a rerun makes Snakemake delete the receipt first.
    # Re-spelling the bucket, or pointing new publications elsewhere, must not re-publish artifacts that
    # already hold a receipt (their payloads may be pruned). Any rerun that does happen re-derives the
    # receipt: publish adopts the identical committed archive from the local manifest's digests. (A
    # params function would also be called for every pending job of a dry-run.)
    script:
        "../scripts/publish.py"


rule publish_all:
    input:
        get_all_receipts,


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
