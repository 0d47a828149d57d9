"""Which rank does what when the trainer API is called by every rank of an initialised process group.

``Ranks.current(collective)`` describes the calling process: with a ``torch.distributed`` process group of
more than one rank initialised (and ``collective`` not False), the call is collective: every rank must make
it, in the same order. Without one (or with ``collective=False``: a caller that saves on one process only,
such as a Trainer callback on the main process), the process acts alone and nothing here talks to a peer.

Rank 0 is the main rank: it takes decisions that touch shared state (the resume guard, clearing an
interrupted save, sealing, publication, the store) and broadcasts them. ``settle`` is the one agreement
point: every rank reports its own outcome; when one rank failed, every rank raises the same ``RankFailed``
naming each failed rank and its error. A single process raises its own error unchanged.

torch is imported only when it is already loaded (a process group cannot exist otherwise).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from ..errors import CkptflowError


class RankFailed(CkptflowError):
    """A collective trainer call failed on at least one rank; every rank raises this same error."""

    def __init__(self, message: str, *, remedy: str | None = None, failures: dict[int, str] | None = None):
        super().__init__(message, remedy=remedy)
        self.failures = dict(failures or {})


def _process_group():
    """``torch.distributed`` when a process group of more than one rank is initialised, else None."""
    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    size: int = 1
    dist: Any = None  # torch.distributed when collective, else None
    group: Any = None  # the process group the calls below use (None: the default one)

    @classmethod
    def current(cls, collective: bool | None = None) -> Ranks:
        """The calling process's ranks: collective when a process group of several ranks is initialised
        and ``collective`` is not False; ``collective=True`` without such a group acts alone too."""
        dist = None if collective is False else _process_group()
        if dist is None:
            return cls()
        return cls(dist.get_rank(), dist.get_world_size(), dist)

    @property
    def collective(self) -> bool:
        return self.dist is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (picklable); the object itself when acting alone."""
        if self.dist is None:
            return obj
        box = [obj if self.is_main else None]
        self.dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather_all(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        if self.dist is None:
            return [obj]
        out: list[Any] = [None] * self.size
        self.dist.all_gather_object(out, obj, group=self.group)
        return out

    def settle(self, what: str, error: Exception | None, payload: Any = None) -> list[Any]:
        """Every rank's ``payload`` once every rank reported success; raises on every rank the same
        ``RankFailed`` when one failed (naming ``what``, each failed rank and its error). Acting alone:
        ``error`` itself is raised."""
        if self.dist is None:
            if error is not None:
                raise error
            return [payload]
        reports = self.gather_all((None if error is None else f"{type(error).__name__}: {error}", payload))
        failures = {r: e for r, (e, _) in enumerate(reports) if e is not None}
        if failures:
            named = "; ".join(f"rank {r}: {e}" for r, e in failures.items())
            raise RankFailed(f"{what} failed on {len(failures)} of {self.size} ranks ({named})",
                             remedy="fix what the failed rank names, then save again; nothing was committed",
                             failures=failures) from error
        return [p for _, p in reports]

    def decide(self, what: str, decide: Any) -> Any:
        """``decide()`` run on rank 0 only; its result (or its failure, as the same ``RankFailed``)
        on every rank. Acting alone: ``decide()`` itself, its error unchanged."""
        if self.dist is None:
            return decide()
        result, error = None, None
        if self.is_main:
            try:
                result = decide()
            except Exception as exc:  # noqa: BLE001 - reported to every rank, then raised there
                error = exc
        self.settle(what, error)
        return self.broadcast(result)
