"""Scrubbing a runs root: ``verify --read-data`` of every published artifact under it, in one command.

Every committed artifact under the runs root (``artifact.committed_artifacts``, what ``status`` shows)
that holds a ``.uploaded`` receipt is verified with its bytes read back (``verify.verify_artifact``,
optionally one ``Subset`` of its files), at every destination its receipt lists or at those named
(``destinations``), one artifact after another, each as one stream of ranges; an artifact without a
receipt, or whose receipt lists none of the named destinations, is listed as ``skipped`` (nothing to
scrub there), and one whose receipt
cannot be used (legacy, another artifact's, another endpoint's) as ``failed`` with the reason, while
the others are still read. Each artifact's outcome goes to its ``.verified.json`` as ``ckptflow verify``
writes it (a whole scrub's, and a slice's when it found damage), so ``status`` shows when the bytes were last
read back; nothing else is written.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from ..artifact import ARTIFACTS_DIR, committed_artifacts
from ..errors import CkptflowError, Refused
from ..fsutil import require_directory
from ..records import receipt as receipt_record
from .destinations import select_destinations
from .verify import Subset, VerifyResult, read_figures, verify_artifact


@dataclass
class ScrubResult:
    runs_root: Path
    subset: Subset | None
    verified: list[VerifyResult] = field(default_factory=list)
    refused: list[tuple[Path, str]] = field(default_factory=list)  # artifacts whose receipt could not be used
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # no receipt, or none of the named destinations
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.refused and all(r.ok for r in self.verified)

    def to_report(self) -> dict:
        """The ``verify --all-under`` report (schemas/report_verify.schema.json)."""
        rows = [{"artifact_dir": str(r.artifact_dir), "status": "verified" if r.ok else "failed",
                 "destination": r.receipt.destination.to_dict(), "objects": [o.to_dict() for o in r.objects],
                 "bytes_read": r.bytes_read}
                | ({"other_destinations": [c.to_dict() for c in r.others]} if r.others else {})
                for r in self.verified]
        rows += [{"artifact_dir": str(a), "status": "failed", "detail": why} for a, why in self.refused]
        rows += [{"artifact_dir": str(a), "status": "skipped", "detail": why} for a, why in self.skipped]
        return {
            "status": "verified" if self.ok else "failed",
            "runs_root": str(self.runs_root),
            "read_data": True,
            "artifacts": sorted(rows, key=lambda row: row["artifact_dir"]),
            **read_figures(self.subset, sum(r.bytes_read for r in self.verified), self.seconds),
        }

    def failure_line(self) -> str:
        bad = [f"{r.artifact_dir} at {'; at '.join(r.failures())}" for r in self.verified if not r.ok]
        bad += [f"{a}: {why}" for a, why in self.refused]
        more = f" (+{len(bad) - 3} more artifacts)" if len(bad) > 3 else ""
        return (f"scrub of {self.runs_root} found damage: {'; '.join(bad[:3])}{more}; keep the local copies and "
                "republish the damaged artifacts to a new destination")


def scrub_runs_root(runs_root: Path | str, store_for, *, subset: Subset | None = None,
                    progress: bool | None = False, destinations: list[str] | tuple[str, ...] | None = None
                    ) -> ScrubResult:
    """Read back and hash every published artifact under ``runs_root`` (see the module docstring)."""
    root = require_directory(runs_root, "runs root", "pass the directory holding the runs")
    result = ScrubResult(root, subset)
    started = time.monotonic()
    for run, name in committed_artifacts(root):
        art = root / run / ARTIFACTS_DIR / name
        if not receipt_record.path_in(art).exists():
            result.skipped.append((art, f"no {receipt_record.FILENAME} receipt: not published"))
            continue
        try:
            if destinations:
                select_destinations(receipt_record.read_receipt(art), destinations, str(receipt_record.path_in(art)))
        except Refused as exc:  # published, but not to a destination named: nothing to scrub there
            result.skipped.append((art, str(exc)))
            continue
        except CkptflowError:
            pass  # verify_artifact names what is wrong with the receipt
        try:
            result.verified.append(verify_artifact(art, store_for, read_data=True, subset=subset, progress=progress,
                                                   destinations=destinations, record=True))
        except CkptflowError as exc:  # this artifact's receipt or destination: named, the others still read
            result.refused.append((art, str(exc)))
    result.seconds = time.monotonic() - started
    return result
