# ckptflow workflow: step reports under reports_dir are the rule targets (never a record the library
# keeps: Snakemake deletes a job's outputs before a rerun); the library decides what is safe.
#   snakemake -n publish_all          pending publications (every committed artifact without its own receipt)
#   snakemake publish_all             publish them
#   snakemake verify_all / prune_all  verify every published artifact / free their local payloads
#   snakemake restore --config iter=300 [run=R] / restore_all [--config run=R]  refill pruned artifacts in place
#   snakemake scrub_all --forcerun scrub   read back and hash every published artifact (config scrub_subset)
#   snakemake merge_experts --config iter=300        the merge recipe of iteration 300
#   snakemake materialize_teacher --config iter=300  its teacher: local artifact, else fetched from the archive
#   snakemake status (the default target)            the status table of every run; --report includes it
import os

from snakemake.utils import min_version

min_version("9.0")


# The defaults beside this Snakefile, whatever the working directory; a site's own file layers over them
# (`snakemake -s <checkout>/Snakefile --configfile site.yaml -- publish_all`, config/site.example.yaml).
configfile: os.path.join(workflow.basedir, "config", "config.yaml")


include: "rules/common.smk"
include: "rules/publish.smk"
include: "rules/verify.smk"
include: "rules/prune.smk"
include: "rules/restore.smk"
include: "rules/merge.smk"
include: "rules/fetch.smk"
include: "rules/materialize.smk"
include: "rules/status.smk"


# The default target is the status table: read-only, and what `snakemake --report report.html` includes.
rule all:
    default_target: True
    input:
        rules.status.output,
