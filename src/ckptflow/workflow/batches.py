"""The batch jobs' plan: how the pending artifacts of one step are cut into batch jobs, each named by a
digest of its members, and the member file a planning writes for each (``write_batch_members``), which the
batch job and its members' own jobs read back (``workflow.batch_jobs``).

``PLANNING`` and ``PLANNED_AT`` identify this Snakemake process's planning: a batch's outcomes are used only
by the jobs of the planning that wrote its member file, never replayed by a later run.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import NotFound
from ..fsutil import atomic_write_bytes
from ..jsonio import encode_json

# Minutes of Slurm runtime per artifact of a batch (see the per-step runtimes in profiles/slurm).
BATCH_MINUTES = {"publish": 30, "verify": 30, "prune": 15}

def batch_sizes(pending: int, max_batches: int, *, min_size: int = 10, max_size: int = 100) -> list[int]:
    """How many artifacts each batch job of one step takes: ``pending`` artifacts spread evenly over at most
    ``max_batches`` jobs (the jobs in flight), none smaller than ``min_size`` (a job's start-up is paid
    once per batch) unless that leaves one, and none larger than ``max_size`` (a batch's runtime is the sum
    of its artifacts'). Sizes differ by one at most; their sum is ``pending``."""
    if pending <= 0:
        return []
    count = max(1, min(max_batches, pending // max(1, min_size)))
    count = max(count, -(-pending // max_size))
    base, extra = divmod(pending, count)
    return [base + 1] * extra + [base] * (count - extra)


def batches(step: str, members: Sequence[tuple[str, str]], max_batches: int) -> dict[str, list[tuple[str, str]]]:
    """The batch jobs of one step: ``members`` (run, iteration), sorted and cut by ``batch_sizes``, each under
    a name that is a digest of the step and its members (a plan with other members is another job)."""
    ordered = sorted(members)
    plan: dict[str, list[tuple[str, str]]] = {}
    start = 0
    for size in batch_sizes(len(ordered), max_batches):
        chunk = ordered[start:start + size]
        start += size
        digest = hashlib.sha256(json.dumps([step, chunk]).encode()).hexdigest()[:16]
        plan[digest] = chunk
    return plan


# This process's planning: written into every batch member file it writes, so a batch's outcomes (which
# record it) are used only by the jobs of the planning that wrote them, never replayed by a later run.
PLANNING = uuid.uuid4().hex
PLANNED_AT = time.time()  # when this process started planning: a batch output older than that is an earlier run's


def write_batch_members(path: str | Path, members: Sequence[Mapping[str, Any]]) -> None:
    """The member file of one batch job: ``{"planned": PLANNING, "members": [...]}`` (its name is a digest
    of the members). Written again by every planning of the same batch: its newer mtime makes Snakemake
    run the batch again rather than keep outcomes an earlier run left (a temp() output whose consumer
    failed stays), and its ``planned`` tells the members' jobs which outcomes are this run's."""
    data = encode_json({"planned": PLANNING, "members": list(members)})
    path = Path(path)
    try:
        if path.read_bytes() == data:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, data)


def batch_members_of(outcomes_path: str | Path) -> Path:
    """The member file beside a batch's outcomes (``<batch>.json`` -> ``<batch>.members.json``)."""
    path = Path(outcomes_path)
    return path.with_name(path.name.removesuffix(".json") + ".members.json")


def read_batch_plan(path: str | Path) -> dict[str, Any]:
    """The member file a planning wrote (``write_batch_members``); a batch whose file is gone, or one
    written by an earlier ckptflow (a bare list, no planning), is refused."""
    try:
        plan = json.loads(Path(path).read_bytes())
        if not isinstance(plan, dict) or not isinstance(plan.get("members"), list):
            raise ValueError("not a batch plan of this ckptflow")
        return plan
    except (OSError, ValueError) as exc:
        raise NotFound(f"batch member file {path} is unreadable ({exc})",
                       remedy="run the same snakemake command again: planning writes it") from None


def read_batch_members(path: str | Path) -> list[dict[str, Any]]:
    """The members of a batch's member file (``read_batch_plan``)."""
    return read_batch_plan(path)["members"]
