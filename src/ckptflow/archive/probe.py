"""Endpoint qualification: does this endpoint really enforce create-once?

Every guarantee of the archive rests on the server refusing a second create of the same key. Request
serialization tests cannot prove that a deployed endpoint honours ``If-None-Match: *`` (S3) or
``x-goog-if-generation-match: 0`` (GCS), so ``probe`` asks the live endpoint, on scratch keys under the
given prefix:

1. a second create-once write of the same key is refused and the first bytes survive;
2. exactly one of N concurrent creators wins, and the stored bytes are the winner's;
3. ``sha256`` user metadata round-trips on HEAD;
4. a wrong ``ChecksumSHA256`` is rejected, where the endpoint offers server-side checksums;
5. (informational) a multipart part with a wrong ``ChecksumSHA256`` is refused and one with the right
   one accepted: where so, publish has the server check every part against the digest taken when
   hashing; elsewhere it hashes what it sends.

The result is cached as a probe record keyed by endpoint + bucket (``records/probe.py``). Destructive
operations (``publish --delete-local``, ``prune-verified``) require a passing record.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

from ..digest import sha256_file
from ..errors import CkptflowError, EndpointNotQualified
from ..records import probe as probe_record
from ..store.base import ObjectStore
from ..store.uri import destination_label

log = logging.getLogger(__name__)

PROBE_DIR = ".ckptflow-probe"
DEFAULT_CREATORS = 8


@dataclass(frozen=True)
class ProbeOutcome:
    record: probe_record.ProbeRecord
    reasons: list[str]  # why it failed; empty when passed


def _scratch_prefix(prefix: str) -> str:
    base = prefix.strip("/")
    token = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"
    return f"{base}/{PROBE_DIR}/{token}" if base else f"{PROBE_DIR}/{token}"


def run_probe(store: ObjectStore, prefix: str, *, creators: int = DEFAULT_CREATORS) -> ProbeOutcome:
    """Run every check on scratch keys under ``prefix``, clean up, cache and return the record."""
    scratch = _scratch_prefix(prefix)
    reasons: list[str] = []
    try:
        second_refused = _check_second_write(store, f"{scratch}/create-once", reasons)
        winners = _check_race(store, f"{scratch}/race", creators, reasons)
        roundtrip = _check_metadata(store, f"{scratch}/metadata", reasons)
        checksum = _check_wrong_checksum(store, f"{scratch}/checksum", reasons)
        part_checksum = _check_part_checksums(store, f"{scratch}/parts")
    finally:
        _cleanup(store, scratch)
    passed = not reasons
    record = probe_record.ProbeRecord.from_dict(
        {
            "protocol": probe_record.PROTOCOL,
            "destination": store.destination.as_dict(),
            "prefix": prefix,
            "checked_at": datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "results": {
                "create_once_refused_second_write": second_refused,
                "concurrent_creators": creators,
                "concurrent_winners": winners,
                "sha256_metadata_roundtrip": roundtrip,
                "checksum_sha256": checksum,
                "part_checksum_sha256": part_checksum,
            },
            "passed": passed,
        }
    )
    probe_record.write_probe_record(record)
    return ProbeOutcome(record=record, reasons=reasons)


def _check_second_write(store: ObjectStore, key: str, reasons: list[str]) -> bool:
    first, second = b"ckptflow probe: first writer\n", b"ckptflow probe: second writer\n"
    if not store.put_bytes_create_once(key, first, sha256=hashlib.sha256(first).hexdigest()):
        reasons.append(f"create-once of a fresh scratch key {key} reported 'already exists'")
        return False
    accepted = store.put_bytes_create_once(key, second, sha256=hashlib.sha256(second).hexdigest())
    stored = store.get_bytes(key)
    if accepted or stored != first:
        reasons.append("a second create-once write of the same key was accepted (If-None-Match not enforced)")
        return False
    return True


def _check_race(store: ObjectStore, key: str, creators: int, reasons: list[str]) -> int:
    barrier = threading.Barrier(creators)
    bodies = [f"ckptflow probe: racer {i}\n".encode() for i in range(creators)]
    won = [False] * creators
    errors: list[BaseException] = []

    def racer(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            won[i] = store.put_bytes_create_once(key, bodies[i], sha256=hashlib.sha256(bodies[i]).hexdigest())
        except CkptflowError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=racer, args=(i,), name=f"probe-racer-{i}") for i in range(creators)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    winners = sum(won)
    if winners != 1:
        reasons.append(f"{winners} of {creators} concurrent create-once writers won (exactly 1 required)")
    else:
        stored = store.get_bytes(key)
        if stored != bodies[won.index(True)]:
            reasons.append("the object left by the concurrent creators is not the winner's bytes")
    return winners


def _check_metadata(store: ObjectStore, key: str, reasons: list[str]) -> bool:
    with tempfile.TemporaryDirectory(prefix="ckptflow-probe-") as tmp:
        path = Path(tmp) / "payload"
        path.write_bytes(secrets.token_bytes(64 * 1024))
        digest = sha256_file(path)
        store.put_file(key, path, digest=digest)
    info = store.head(key)
    if info is None or info.sha256 != digest.sha256 or info.size != digest.size:
        reasons.append("sha256 user metadata did not round-trip on HEAD")
        return False
    return True


def _check_wrong_checksum(store: ObjectStore, key: str, reasons: list[str]) -> str:
    if not store.supports_checksum_sha256:
        return "not-offered"
    if store.put_bytes_wrong_checksum(key, b"ckptflow probe: checksum\n"):
        reasons.append("the endpoint accepted an object whose ChecksumSHA256 does not match its bytes")
        return "accepted-wrong"
    return "rejected-wrong"


def _check_part_checksums(store: ObjectStore, key: str) -> str:
    """Informational, never a failure: where parts are not checked by the server, uploads hash what
    they send themselves."""
    check = store.multipart.part_checksums_enforced if store.multipart is not None else None
    if check is None or not store.supports_checksum_sha256:
        return "not-offered"
    return "enforced" if check(key) else "not-enforced"


def _cleanup(store: ObjectStore, scratch: str) -> None:
    try:
        for info in store.list(scratch + "/"):
            store.delete(info.key)
    except CkptflowError as exc:  # cleanup must not hide the probe's own result
        log.warning("could not remove probe scratch keys under %s: %s", scratch, exc)


def require_qualified(store: ObjectStore, prefix: str, *, auto_probe: bool = True) -> probe_record.ProbeRecord:
    """A passing probe record for the store's endpoint + bucket, probing once if none is cached."""
    dest = store.destination.as_dict()
    record = probe_record.read_probe_record(dest)
    reasons: list[str] = []
    if record is None and auto_probe:
        log.info("no cached probe record for %s; probing the endpoint now", _label(dest))
        outcome = run_probe(store, prefix)
        record, reasons = outcome.record, outcome.reasons
    if record is None or not record.passed:
        why = f" (the probe just run found: {'; '.join(reasons)})" if reasons else \
            " (create-once enforcement is unproven)"
        raise EndpointNotQualified(
            f"endpoint {_label(dest)} has no passing probe record{why}",
            remedy="run `ckptflow probe` against it; destructive operations need an endpoint that enforces create-once",
        )
    return record


def pending_probe(store: ObjectStore, prefix: str) -> str | None:
    """What ``require_qualified`` would still have to do, without doing it (a dry run writes nothing): None
    when a passing probe record is cached; a sentence when the endpoint would be probed first (scratch
    objects written under ``prefix``, a record into the cache). A cached failing record raises, as there."""
    dest = store.destination.as_dict()
    record = probe_record.read_probe_record(dest)
    if record is None:
        scratch = "/".join(p for p in (prefix.strip("/"), PROBE_DIR) if p)
        return (f"would probe endpoint {_label(dest)} first (no cached probe record): the real run writes and "
                f"removes scratch objects under {scratch}/, caches the record, and removes payloads only if "
                "the probe passes")
    if not record.passed:
        require_qualified(store, prefix, auto_probe=False)  # raises, naming the endpoint and the remedy
    return None


def _label(dest: dict[str, str]) -> str:
    if not dest["bucket"]:
        return f"{dest['scheme']}://{dest['endpoint']}"
    return destination_label(SimpleNamespace(**dest))


