"""The endpoint probe record: what ``ckptflow probe`` observed on a live endpoint, cached locally.

Publication with ``--delete-local`` and ``prune-verified`` require a passing record for the endpoint
and bucket they use. Records live in the user's cache, one file per endpoint + bucket::

    $CKPTFLOW_CACHE_DIR (default ~/.cache/ckptflow)/
    └── probes/
        └── <sha256 of "scheme|endpoint|bucket">.json    this record

    {
      "checked_at": "2025-01-31T12:00:00Z",
      "destination": {"bucket": "ckpts", "endpoint": "127.0.0.1:18333", "scheme": "s3"},
      "passed": true,
      "prefix": "ckptflow-probe/<random>",
      "protocol": "ckptflow.probe.v1",
      "results": {
        "checksum_sha256": "rejected-wrong",
        "concurrent_creators": 8,
        "concurrent_winners": 1,
        "create_once_refused_second_write": true,
        "part_checksum_sha256": "enforced",
        "sha256_metadata_roundtrip": true
      }
    }

A record that says ``passed`` while its own results show create-once not enforced (a second write
accepted, not exactly one winner, metadata lost, a wrong checksum accepted) is refused as corrupt.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..digest import sha256_bytes
from ..errors import InvalidRecord
from . import _record

PROTOCOL = "ckptflow.probe.v1"
CHECKSUM_OUTCOMES = ("rejected-wrong", "accepted-wrong", "not-offered")

KIND = _record.RecordKind(
    filename="probe.json",
    schema="probe",
    protocol=PROTOCOL,
    legacy_remedy="run `ckptflow probe` again",
    precheck=_record.check_destination,
)


@dataclass(frozen=True, slots=True)
class ProbeDestination(_record.Flat):
    scheme: str
    endpoint: str
    bucket: str

    @classmethod
    def of(cls, destination: Any) -> ProbeDestination:
        """From a mapping or any object with ``scheme``, ``endpoint`` and ``bucket`` (a store Destination)."""
        if isinstance(destination, Mapping):
            return cls(destination["scheme"], destination["endpoint"], destination["bucket"])
        return cls(destination.scheme, destination.endpoint, destination.bucket)

    def key(self) -> str:
        return sha256_bytes(f"{self.scheme}|{self.endpoint}|{self.bucket}".encode())


@dataclass(frozen=True, slots=True)
class ProbeResults:
    create_once_refused_second_write: bool
    concurrent_creators: int
    concurrent_winners: int
    sha256_metadata_roundtrip: bool
    checksum_sha256: str
    # Informational: whether upload parts are checked by the server (None in records written before it).
    part_checksum_sha256: str | None = None

    @property
    def qualifies(self) -> bool:
        """Whether the endpoint passed every check that deleting local bytes relies on (create-once writes, one
        winner among concurrent creators, SHA-256 metadata kept, wrong checksums refused)."""
        return (
            self.create_once_refused_second_write
            and self.concurrent_creators >= 2
            and self.concurrent_winners == 1
            and self.sha256_metadata_roundtrip
            and self.checksum_sha256 != "accepted-wrong"
        )

    def to_dict(self) -> dict[str, Any]:
        out = {
            "create_once_refused_second_write": self.create_once_refused_second_write,
            "concurrent_creators": self.concurrent_creators,
            "concurrent_winners": self.concurrent_winners,
            "sha256_metadata_roundtrip": self.sha256_metadata_roundtrip,
            "checksum_sha256": self.checksum_sha256,
        }
        if self.part_checksum_sha256 is not None:
            out["part_checksum_sha256"] = self.part_checksum_sha256
        return out


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    destination: ProbeDestination
    prefix: str
    checked_at: str
    results: ProbeResults
    passed: bool

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, what: str = "probe record") -> ProbeRecord:
        _record.check_object(KIND, data, what)
        res = data["results"]
        results = ProbeResults(
            create_once_refused_second_write=res["create_once_refused_second_write"],
            concurrent_creators=_record.require_size(
                res["concurrent_creators"], what, "results.concurrent_creators"
            ),
            concurrent_winners=_record.require_size(
                res["concurrent_winners"], what, "results.concurrent_winners"
            ),
            sha256_metadata_roundtrip=res["sha256_metadata_roundtrip"],
            checksum_sha256=res["checksum_sha256"],
            part_checksum_sha256=res.get("part_checksum_sha256"),
        )
        if results.concurrent_winners > results.concurrent_creators:
            raise InvalidRecord(
                f"{what}: {results.concurrent_winners} concurrent winners among {results.concurrent_creators} creators",
                remedy="the record is corrupt; run `ckptflow probe` again",
            )
        if data["passed"] and not results.qualifies:
            raise InvalidRecord(
                f"{what} says passed but its results do not qualify the endpoint",
                remedy="the record is corrupt; run `ckptflow probe` again",
            )
        return cls(
            destination=ProbeDestination.of(data["destination"]),
            prefix=data["prefix"],
            checked_at=_record.require_utc_timestamp(data["checked_at"], what, "checked_at"),
            results=results,
            passed=data["passed"],
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "destination": self.destination.to_dict(),
            "prefix": self.prefix,
            "checked_at": self.checked_at,
            "results": self.results.to_dict(),
            "passed": self.passed,
        }


def probe_cache_dir() -> Path:
    """``$CKPTFLOW_CACHE_DIR/probes``, else ``~/.cache/ckptflow/probes``."""
    root = os.environ.get("CKPTFLOW_CACHE_DIR") or Path.home() / ".cache" / "ckptflow"
    return Path(root) / "probes"


def probe_record_path(destination: Any) -> Path:
    """Where the record for ``destination`` (mapping or Destination) lives: keyed by scheme|endpoint|bucket."""
    return probe_cache_dir() / f"{ProbeDestination.of(destination).key()}.json"


_FILE = _record.RecordFile(KIND, ProbeRecord, label="probe record")
parse_probe_record = _FILE.parse
encode_probe_record = _FILE.encode


def write_probe_record(record: ProbeRecord) -> Path:
    path = probe_record_path(record.destination)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _record.write_record(KIND, path, record)


def read_probe_record(destination: Any) -> ProbeRecord | None:
    """The cached record for ``destination``; None when there is none, ``InvalidRecord`` when corrupt."""
    wanted = ProbeDestination.of(destination)
    path = probe_record_path(wanted)
    what = f"probe record {path}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    record = parse_probe_record(data, what=what)
    if record.destination != wanted:
        raise InvalidRecord(
            f"{what} is for a different destination than the one asked for",
            remedy="delete it and run `ckptflow probe` again",
        )
    return record
