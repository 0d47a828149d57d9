"""The Snakemake workflow's library: everything the Snakefile and its ``scripts/`` shims call.

- ``config``: the configuration in ``--config`` terms (typing, validation, the checks a target needs, the
  one line a refusal prints);
- ``plan``: what each input function returns (what is pending, the targets, the batch a member takes);
- ``triggers``: the paths of a job and its rerun triggers, read from records; where a teacher comes from;
- ``batches``: how pending artifacts are cut into batch jobs, and their member files;
- ``steps``: one function per rule, the job's log and its one-line failure;
- ``batch_jobs``: the batch jobs and the per-artifact jobs that finish their members.

The rules (``rules/*.smk``) keep only rules and one-line input functions over a ``plan.Plan``.
"""
