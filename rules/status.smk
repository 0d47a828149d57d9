# The status table of every run: rebuilt when any record it reads changed (the fingerprint parameter),
# read-only otherwise. It is the default target, so `snakemake --report` includes it.
rule status:
    default_target: True
    output:
        json=report(
            f"{REPORTS}/status.json",
            category="Status",
            labels={"table": "json"},
        ),
        txt=report(
            f"{REPORTS}/status.txt",
            category="Status",
            labels={"table": "text"},
        ),
    log:
        f"{LOGS}/status.log",
    conda:
        "../environment.yml"
    params:
        fingerprint=get_records_fingerprint,
    script:
        "../scripts/status.py"
