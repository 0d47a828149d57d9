# ckptflow workflow: marker files are rule targets; the library decides what is safe.
#   snakemake -n publish_all          pending publications (every committed artifact without a receipt)
#   snakemake publish_all             publish them
#   snakemake verify_all / prune_all  verify every published artifact / free their local payloads
from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/publish.smk"
include: "rules/verify.smk"
include: "rules/prune.smk"
