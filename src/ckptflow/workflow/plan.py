"""The workflow's plan: what each input function of the Snakefile returns, computed from the runs tree, the
step reports and the configuration, without Snakemake.

``rules/common.smk`` makes one ``Plan`` of the validated configuration and its input functions are one line
over it, each wrapped by ``workflow.config.one_line_errors`` where a refusal is possible; what Snakemake
alone knows (its targets, how many batch jobs run at once, whether it executes) comes in as callables.
The plan says:

- what is pending: the publications (every committed artifact without a receipt that belongs to it), the
  verify and prune reports, the restores, the scrub slice; the targets of ``config iter`` (merge, teacher,
  restore) with the checks each needs before planning;
- what a job takes as input and its rerun triggers (``workflow.triggers``: publication numbers, prune
  rounds, the receipt's inputs, the status fingerprint);
- the batch jobs of publish, verify and prune (``workflow.batches``) and which batch each member's own job
  takes its outcome from.

It reads records and stats files only (never a store); it writes the batch jobs' member files, and the status
table when Snakemake plans without executing (``triggers.show_status``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..artifact import committed_artifacts
from ..errors import UsageError
from ..records.manifest import FILENAME as MANIFEST
from ..records.receipt import FILENAME as RECEIPT
from ..records.receipt import Receipt, belonging_receipt, is_legacy_receipt
from . import config as wconfig
from . import triggers
from .batches import BATCH_MINUTES, batches, read_batch_members, write_batch_members


def max_batches(workflow: Any) -> int:
    """Batch jobs of one step worth running at once for a Snakemake ``workflow``: --jobs under a cluster
    executor, else --cores."""
    nodes = workflow.resource_settings.nodes
    if workflow.executor_plugin is not None and not workflow.executor_plugin.common_settings.non_local_exec:
        nodes = None
    if not nodes or nodes >= 2**31:
        nodes = workflow.resource_settings.cores
    return max(1, int(nodes or 1))


class Plan:
    """The plan of one Snakemake process over a validated configuration (``config.checked_config``, then the
    schema's defaults). ``targets``: the targets Snakemake parsed, once planning started; ``max_batches``:
    batch jobs of one step worth running at once; ``executing``: whether Snakemake will execute (a run or a
    dry-run) rather than only plan (``--report``). What it reads is read once per plan, as a planning reads it.
    """

    def __init__(self, config: Mapping[str, Any], *, targets: Callable[[], Iterable[str]] = tuple,
                 max_batches: Callable[[], int] = lambda: 1, executing: Callable[[], bool] = lambda: True) -> None:
        self.config = config
        self.runs = config["runs_root"].rstrip("/")
        self.reports = config["reports_dir"].rstrip("/")
        self.logs = config["logs_dir"].rstrip("/")
        self.stage = config["stage_dir"].rstrip("/")
        self.teachers = config["teachers_dir"].rstrip("/")
        self._targets = targets
        self._max_batches = max_batches
        self._executing = executing
        self._receipts: dict[tuple[str, str], Receipt | None] = {}
        self._sources: dict[tuple[str, str], triggers.TeacherSource] = {}
        self._target: dict[bool, tuple[str, str]] = {}
        self._batches: dict[str, dict[tuple[str, str], str]] = {}

    # ------------------------------------------------------------------------------ paths and records

    def committed_artifacts(self) -> list[tuple[str, str]]:
        """(run, iteration) of every artifact whose native manifest is committed: the runs `ckptflow status`
        shows, found without walking into a run's checkpoints (one listing per directory above the runs)."""
        return committed_artifacts(self.runs)

    def artifact_dir(self, run: str, iteration: str) -> str:
        """The directory of one artifact under runs_root (the rules' ARTIFACT with its wildcards filled in)."""
        return triggers.artifact_path(self.runs, run, iteration)

    def report(self, step: str, run: str, iteration: str) -> str:
        """The step report of one artifact: ``<reports_dir>/<step>/<run>/<iteration>.json``."""
        return f"{self.reports}/{step}/{run}/{iteration}.json"

    def is_legacy(self, run: str, iteration: str) -> bool:
        """True when the artifact's .uploaded is a legacy plain-text marker: it proves nothing."""
        return is_legacy_receipt(self.artifact_dir(run, iteration))

    def own_receipt(self, run: str, iteration: str) -> Receipt | None:
        """The artifact's receipt when it is its own, else None (read once per plan)."""
        key = (run, iteration)
        if key not in self._receipts:
            self._receipts[key] = belonging_receipt(self.artifact_dir(run, iteration))
        return self._receipts[key]

    def receipt_belongs(self, run: str, iteration: str) -> bool:
        """True when the artifact holds a receipt that is its own."""
        return self.own_receipt(run, iteration) is not None

    def archive_schemes(self, run: str, iteration: str) -> list[str]:
        """The schemes of the stores the jobs of one artifact open: its own receipt's destination; without one,
        the destinations its step reports name (a lost receipt is re-derived there), else the bucket, which
        must then be set. Checked while planning with the words the job would use."""
        receipt = self.own_receipt(run, iteration)
        if receipt is not None:
            return [receipt.destination.scheme]
        recorded = triggers.recorded_destinations(triggers.step_reports(self.reports, run, iteration))
        if recorded:
            return [dest.scheme for dest in recorded]
        return [wconfig.require_bucket(self.config["bucket"]).scheme]

    def require_destination(self, run: str, iteration: str) -> None:
        """What the jobs of one artifact need to reach its archive: the bucket when they publish it to the
        bucket, and credentials that exist and parse when a configured file is what opens it."""
        wconfig.require_credentials(self.config["credentials"], self.archive_schemes(run, iteration))

    # ------------------------------------------------------------------------------ publish, verify, prune

    def pending_publications(self) -> list[str]:
        """The pending publications: a report per committed artifact without a receipt that belongs to it
        (missing, legacy, full-checkpoint, another artifact's); a legacy marker is replaced by publication."""
        wconfig.require_runs_root(self.runs)
        pending = [(run, it) for run, it in self.committed_artifacts() if not self.receipt_belongs(run, it)]
        for run, it in pending:
            self.require_destination(run, it)
        return [self.report("legacy-receipt" if self.is_legacy(run, it) else "publish", run, it)
                for run, it in pending]

    def publish_all_input(self) -> list[str]:
        """The pending publications, and the manifest of every committed artifact: a target rule without
        inputs always runs, and `snakemake -n publish_all` says "Nothing to be done" when nothing is pending."""
        manifests = [f"{self.artifact_dir(run, it)}/{MANIFEST}" for run, it in self.committed_artifacts()]
        return self.pending_publications() + manifests

    def receipt_input(self, run: str, iteration: str) -> list[str]:
        """What verify and prune take for the receipt. The set of files must not change when a publication
        completes (a changed set of inputs reruns a job): the publish report once it exists or while the
        receipt is pending, the receipt itself for an artifact published outside the workflow, and for a
        legacy marker (or one replaced before) the marker with the publication that replaces it."""
        receipt = f"{self.artifact_dir(run, iteration)}/{RECEIPT}"
        replaced = self.report("legacy-receipt", run, iteration)
        published = self.report("publish", run, iteration)
        if self.is_legacy(run, iteration) or (os.path.exists(replaced) and self.receipt_belongs(run, iteration)):
            return [receipt, replaced]
        if os.path.exists(published) or not self.receipt_belongs(run, iteration):
            return [published]
        return [receipt]

    def publication(self, run: str, iteration: str) -> int:
        """The publish job's rerun trigger (``triggers.publication_number``); a job that will publish has its
        destination checked here, while planning (verify_all and prune_all plan publications too)."""
        if not self.receipt_belongs(run, iteration):
            self.require_destination(run, iteration)
        return triggers.publication_number(self.artifact_dir(run, iteration), self.report("publish", run, iteration))

    def all_reports(self, step: str) -> list[str]:
        """Every committed artifact's ``step`` report (verify, prune): every such job opens the archive (and
        publishes first without a receipt), so each artifact's destination is checked here."""
        wconfig.require_runs_root(self.runs)
        artifacts = self.committed_artifacts()
        for run, it in artifacts:
            self.require_destination(run, it)
        return [self.report(step, run, it) for run, it in artifacts]

    def prune_round(self, run: str, iteration: str) -> int:
        """The prune job's rerun trigger: see ``triggers.prune_round``."""
        return triggers.prune_round(self.report("prune", run, iteration))

    def keep_free_report(self) -> str:
        return f"{self.reports}/prune/keep-free.json"

    def keep_free_round(self) -> int:
        """The keep-free prune job's rerun trigger: see ``triggers.prune_round``."""
        return triggers.prune_round(self.keep_free_report())

    def prune_all_input(self) -> list[str]:
        """Every artifact's prune report, or with config prune.keep_free the one keep-free report."""
        if triggers.keep_free_target(self.config) is None:
            return self.all_reports("prune")
        return [self.keep_free_report()]

    # ------------------------------------------------------------------------------ iteration-scoped targets

    def iteration(self) -> int:
        """config iter, required by merge_experts and materialize_teacher (an `iter=300` Snakemake took as a
        target is named as such first)."""
        wconfig.refuse_overrides_as_targets(self._targets())
        return wconfig.require_iteration(self.config["iter"], self.runs)

    def target(self, may_be_new: bool) -> tuple[str, str]:
        """(run, iter_N) of config iter: config run, else the one run holding it; a configured run or
        iteration that is not on disk is refused unless the target writes or fetches it (may_be_new)."""
        if may_be_new not in self._target:
            self._target[may_be_new] = wconfig.resolve_target(self.runs, self.iteration(), self.config["run"],
                                                              may_be_new=may_be_new)
        return self._target[may_be_new]

    def merge_target(self) -> str:
        """merge_experts: the recipe of config iter, its experts and (tv) its base, checked before planning."""
        iteration = self.iteration()
        recipe = wconfig.require_merge_recipe(self.config, iteration)
        run, name = self.target(True)
        wconfig.require_experts(recipe["experts"], iteration)
        if recipe["mode"] == "tv":
            key = f"merge.{iteration}.base" if recipe.get("base") else "base"
            wconfig.require_base(recipe.get("base") or self.config["base"], key=key)
        return self.report("merge", run, name)

    def teacher_target(self) -> str:
        """materialize_teacher: the iteration, the run, the base and, for a teacher built from the archive,
        the bucket and credentials, checked before planning (what the materialize job needs)."""
        iteration = self.iteration()
        has_recipe = wconfig.merge_recipe(self.config, iteration) is not None
        bucket = self.config["bucket"] or os.environ.get("CKPTFLOW_BUCKET")
        run, name = self.target(has_recipe or bool(bucket))
        source = self.teacher_source(run, name)
        wconfig.require_base(self.config["base"])
        # A receipt with a file:// copy is served by it whatever the credentials: the job skips a copy they
        # cannot open.
        schemes = (source.schemes or (source.uri.partition("://")[0],)) if source.kind == "archive" else ()
        if schemes and "file" not in schemes:
            wconfig.require_credentials(self.config["credentials"], schemes)
        return self.report("materialize", run, name)

    def merge_recipe(self, iteration: str) -> dict[str, Any]:
        """The recipe of the iteration, a tv merge without its own base on the top-level base."""
        recipe = wconfig.require_merge_recipe(self.config, wconfig.parse_iteration(iteration))
        if recipe["mode"] == "tv" and not recipe.get("base"):
            return {**recipe, "base": self.config["base"]}
        return recipe

    def merge_experts(self, iteration: str) -> list[str]:
        return list(self.merge_recipe(iteration)["experts"])

    def teacher_source(self, run: str, iteration: str) -> triggers.TeacherSource:
        """Where the teacher of one artifact is built from (``triggers.teacher_source``; chosen once per plan)."""
        key = (run, iteration)
        if key not in self._sources:
            has_recipe = wconfig.merge_recipe(self.config, wconfig.parse_iteration(iteration)) is not None
            self._sources[key] = triggers.teacher_source(self.artifact_dir(run, iteration), run,
                                                         bucket=self.config["bucket"], has_recipe=has_recipe)
        return self._sources[key]

    def teacher_input(self, run: str, iteration: str) -> list[str]:
        """The local artifact when its model payload is present with its recorded size (or the merge that
        writes it); nothing from the archive: materialize decides on the teacher first and fetches into
        the stage only what a build reads (an intact teacher is skipped without a download)."""
        source = self.teacher_source(run, iteration)
        if source.kind == "merge":
            return [self.report("merge", run, iteration)]
        if source.kind == "local":
            return [f"{source.artifact_dir}/{MANIFEST}"]
        return []

    def teacher_ckpt_dir(self, run: str, iteration: str) -> str | None:
        """The local artifact materialize reads: in place, or once pruned through its receipt (every destination
        it lists is tried); None when there is no local artifact and it builds from the bucket."""
        source = self.teacher_source(run, iteration)
        return None if source.kind == "archive" and not source.receipt else str(source.artifact_dir)

    def teacher_uri(self, run: str, iteration: str) -> str | None:
        """The archive materialize builds from (fetched into the fetch rule's stage when a build needs it), so
        the teacher records the archive's identity; None when the local artifact is used in place. For a
        pruned artifact, the current destination its receipt names: materialize tries every one it lists."""
        source = self.teacher_source(run, iteration)
        return source.uri if source.kind == "archive" else None

    def fetch_uri(self, run: str, iteration: str) -> str:
        """The archive of the artifact: named by its receipt, or under the bucket when there is no local copy."""
        source = self.teacher_source(run, iteration)
        if source.uri is None:
            raise UsageError(f"{source.artifact_dir} is used in place ({source.why}); nothing to fetch",
                             remedy="target materialize_teacher; it fetches only when the payload is gone")
        return source.uri

    def fetch_receipt_dir(self, run: str, iteration: str) -> str | None:
        """The pruned artifact whose receipt names the archive to fetch (every destination it lists is tried),
        None when the archive is found under the bucket."""
        source = self.teacher_source(run, iteration)
        return str(source.artifact_dir) if source.receipt else None

    def stage_root(self, run: str) -> str:
        return f"{self.stage}/{run}"

    def teacher_out(self, run: str, iteration: str) -> str:
        return f"{self.teachers}/{run}/{iteration}"

    def records_fingerprint(self, out_json: str, out_txt: str) -> str:
        """The status rule's rerun trigger: it reruns when what status would print changed (a record, or a
        file a record names gone or resized).

        Evaluated whenever the status job is planned, which is how the table reaches the terminal on every
        invocation and a report is never older than its table: Snakemake runs no job (and no onstart or
        onsuccess hook) when the table is up to date, and `--report` runs no job at all, so the job alone
        could do neither. ``triggers.show_status`` prints the current table here when Snakemake executes (a
        run or a dry-run; the job itself prints nothing), and rewrites it when it plans without executing
        (--report, --summary, --dag), so those read the table of now."""
        wconfig.require_runs_root(self.runs)
        status = triggers.show_status(self.runs, self.reports, self.stage, self.teachers, out_json, out_txt,
                                      executing=self._executing())
        return triggers.records_fingerprint(self.runs, self.reports, self.stage, self.teachers, status=status)

    # ------------------------------------------------------------------------------ restore, scrub

    def restore_input(self, run: str, iteration: str) -> list[str]:
        """The artifact directory (and a directory that lost a payload): its mtime is the rerun trigger."""
        return triggers.restore_inputs(self.artifact_dir(run, iteration))

    def restore_target(self) -> str:
        """restore: the artifact of config iter, which must be on disk (restore refills it in place)."""
        run, name = self.target(False)
        return self.report("restore", run, name)

    def all_restore_reports(self) -> list[str]:
        """A report per committed artifact with a receipt and a missing payload (of config run, else of
        every run), and every manifest in that scope: a target rule without inputs always runs, and
        `snakemake -n restore_all` says "Nothing to be done" once every artifact is local again."""
        scope = triggers.restore_scope(self.runs, self.config["run"])
        reports = [self.report("restore", run, it) for run, it, pruned in scope if pruned]
        return reports + [f"{self.artifact_dir(run, it)}/{MANIFEST}" for run, it, _ in scope]

    def scrub_report(self) -> str:
        """The scrub report of config scrub_subset: scrub/K-of-N.json, or scrub/all.json for every file."""
        return f"{self.reports}/scrub/{triggers.scrub_slice_name(self.config['scrub_subset'])}.json"

    # ------------------------------------------------------------------------------ batches
    # publish, verify and prune run in batch jobs (the rules <step>_batch): one process per batch runs the
    # step of each of its artifacts (``batch_jobs.batch_step``), and the artifact's own rule, a local job,
    # writes its report and log from the outcome, or fails alone (``batch_jobs.finish_member``). A batch's
    # members are the artifacts whose report is missing when Snakemake plans; they are written, with each
    # one's rerun trigger and this planning's id, to a file named by their digest, which the batch job
    # (planned again on the node) reads back. Every planning writes it again, so outcomes an earlier run
    # left are never used: Snakemake runs the batch again (its member file is newer), and a member job runs
    # its step itself when the outcomes it finds carry another planning's id. A job Snakemake reruns for
    # another reason (a lost receipt, a restored payload, -R) reruns the batch its report names (its other
    # members' outcomes go unused), or runs the step itself when there is none.

    def batch_member(self, step: str, run: str, iteration: str) -> dict[str, Any]:
        """The rerun trigger the artifact's own rule gets (the batch records it with the artifact)."""
        if step == "publish":
            return {"run": run, "iteration": iteration, "publication": self.publication(run, iteration)}
        if step == "prune":
            return {"run": run, "iteration": iteration, "round": self.prune_round(run, iteration)}
        return {"run": run, "iteration": iteration}

    def step_batches(self, step: str) -> dict[tuple[str, str], str]:
        """{(run, iteration): batch name} of the artifacts of ``step`` whose report is missing, their member
        files written under reports_dir/batches/<step>/ (once per plan)."""
        if step in self._batches:
            return self._batches[step]
        if step == "publish":
            todo = [(run, it) for run, it in self.committed_artifacts()
                    if not self.receipt_belongs(run, it) and not self.is_legacy(run, it)
                    and not os.path.exists(self.report("publish", run, it))]
        else:
            todo = [(run, it) for run, it in self.committed_artifacts()
                    if not os.path.exists(self.report(step, run, it))]
        index = {}
        for name, members in batches(step, todo, self._max_batches()).items():
            write_batch_members(self.batch_members_path(step, name),
                                [self.batch_member(step, run, it) for run, it in members])
            index.update({member: name for member in members})
        self._batches[step] = index
        return index

    def batch_members_path(self, step: str, name: str) -> str:
        return f"{self.reports}/batches/{step}/{name}.members.json"

    def batch_outcomes_path(self, step: str, name: str) -> str:
        return f"{self.reports}/batches/{step}/{name}.json"

    def member_batch(self, step: str, run: str, iteration: str) -> list[str]:
        """The input of a per-artifact rule: its batch's outcomes, or nothing outside a batch. Once the report
        exists, the batch its report names (while that batch's member file is there): the set of input files
        must stay what it was when the job ran, and a deleted temp() file alone reruns nothing."""
        own_report = self.report(step, run, iteration)
        if os.path.exists(own_report):
            name = triggers.report_batch(own_report)
            if (name is None or not os.path.exists(self.batch_members_path(step, name))
                    or self.reruns_alone(step, run, iteration, own_report)):
                return []
        else:
            name = self.step_batches(step).get((run, iteration))
        return [] if name is None else [self.batch_outcomes_path(step, name)]

    def reruns_alone(self, step: str, run: str, iteration: str, own_report: str) -> bool:
        """True when the job of an artifact with a report reruns on a trigger of its own (a lost receipt, a
        restored payload, a newer publication): it runs its step itself rather than its old batch again."""
        if step == "publish":
            return not self.receipt_belongs(run, iteration)
        if step == "prune":
            return self.prune_round(run, iteration) != triggers.report_round(own_report)
        done = os.path.getmtime(own_report)
        return any(os.path.exists(f) and os.path.getmtime(f) > done for f in self.receipt_input(run, iteration))

    def batch_inputs(self, step: str, name: str) -> dict[str, Any]:
        """The input of a batch rule: its member file, and what each member's own rule takes as input."""
        inputs = []
        for m in read_batch_members(self.batch_members_path(step, name)):
            if step == "publish":
                inputs.append(f"{self.artifact_dir(m['run'], m['iteration'])}/{MANIFEST}")
            else:
                inputs.extend(self.receipt_input(m["run"], m["iteration"]))
            if step == "prune":
                inputs.append(self.report("verify", m["run"], m["iteration"]))
        return {"members": self.batch_members_path(step, name), "done": inputs}

    def batch_runtime(self, step: str, name: str) -> int:
        """Minutes of Slurm runtime of a batch job: ``BATCH_MINUTES`` per member."""
        return BATCH_MINUTES[step] * len(read_batch_members(self.batch_members_path(step, name)))
