"""What an archive holds under a prefix: ``list_archive``, one ``ArchivedArtifact`` per run and iteration.

An archived artifact is every object below a ``.../checkpoint_artifacts/iter_N/`` key prefix (``keys.py``).
Per artifact the listing (paginated, one pass over the prefix) gives its objects, sizes and times, and
one small GET reads its declaration; payloads are never read. The states, from the records alone::

    committed        declaration + manifest listed at the declared size, every declared file listed at its size
    damaged          committed, but a declared file is missing from the listing or has another size
    incomplete       declaration only: a publication that was interrupted or is still running
    legacy           manifest only (the retired publisher wrote no declaration): counted from the manifest
    corrupt          a record that cannot be read or contradicts its place or the listing
    not-an-artifact  objects under checkpoint_artifacts/iter_N/ but neither record: not written by ckptflow

Objects outside any ``checkpoint_artifacts/iter_N/`` (full checkpoints, anything else) are not artifacts:
they are counted and sampled as ``other``, never read. The manifest's bytes are not fetched for a
committed artifact (its size is checked against the declaration; ``verify`` and ``fetch`` check its
digest), so a listing costs one GET per artifact, started as soon as the declaration's key is listed
(while the next page is fetched) and sent concurrently by as many threads as the store's transfers use,
through the store's ``small_gets`` where it has them (S3: signed requests outside botocore's machinery).

Each artifact keeps what binds a copy to it: the manifest digest its declaration records (a legacy
one's: the digest of the manifest read) and the declaration's bytes. The local column of ``ls --runs-root``
is judged from them one floor up, in ``status/listed.py``, which reads the runs root as ``status`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..artifact import ARTIFACTS_DIR, ITER_DIR_RE, RUN_DEPTH
from ..digest import sha256_bytes
from ..errors import CkptflowError, UsageError
from ..records import (
    DECLARATION_FILENAME,
    MANIFEST_FILENAME,
    LegacyRecord,
    parse_declaration,
    parse_manifest,
    payload_sizes,
    utc_timestamp,
)
from ..store.base import ObjectInfo, ObjectStore
from ..store.uri import StoreURI, segment_prefix
from .keys import object_key

STATES = ("committed", "damaged", "incomplete", "legacy", "corrupt", "not-an-artifact")
CORRUPT = "corrupt"
# A record larger than this is not one of ours (a declaration of 100,000 files is about 15 MiB).
MAX_RECORD_BYTES = 64 * 1024 * 1024
SAMPLES = 5  # keys of other objects quoted in the report


@dataclass
class ArchivedArtifact:
    """One ``checkpoint_artifacts/iter_N`` prefix of the archive and what its records and listing say."""

    run: str
    name: str
    iteration: int
    uri: str
    prefix: str  # its key prefix in the store that was listed
    objects: dict[str, ObjectInfo]  # by path relative to the artifact
    state: str = "not-an-artifact"
    detail: str | None = None
    files: int | None = None
    bytes: int | None = None
    local: dict[str, Any] | None = None
    declaration: Future[bytes] | None = field(default=None, repr=False)  # its GET, started while listing
    # The digest of the manifest this archive binds (its declaration's; a legacy one's, of the bytes read);
    # None when no record of it could be read.
    manifest_sha256: str | None = field(default=None, repr=False)

    def declaration_bytes(self) -> bytes | None:
        """The declaration read while listing; None when there is none or it could not be read."""
        future = self.declaration
        return future.result() if future is not None and future.done() and future.exception() is None else None

    def modified(self, rel: str) -> str | None:
        info = self.objects.get(rel)
        if info is None or info.modified is None:
            return None
        return utc_timestamp(datetime.fromtimestamp(info.modified, timezone.utc))

    def to_dict(self) -> dict[str, Any]:
        out = {
            "run": self.run, "name": self.name, "iteration": self.iteration, "uri": self.uri, "state": self.state,
            "files": self.files, "bytes": self.bytes, "objects": len(self.objects),
            "object_bytes": sum(i.size for i in self.objects.values()),
            "declared_at": self.modified(DECLARATION_FILENAME),
            "published_at": self.modified(MANIFEST_FILENAME) if self.state in ("committed", "damaged", "legacy")
            else None,
        }
        if self.detail:
            out["detail"] = self.detail
        if self.local is not None:
            out["local"] = self.local
        return out


@dataclass
class Listing:
    uri: StoreURI
    artifacts: list[ArchivedArtifact]
    other: list[ObjectInfo] = field(default_factory=list)
    runs_root: Path | None = None

    def counts(self) -> dict[str, int]:
        out = {state: sum(a.state == state for a in self.artifacts) for state in STATES}
        out.update(artifacts=len(self.artifacts), runs=len({a.run for a in self.artifacts}), other_objects=len(self.other))
        return out

    def to_report(self) -> dict[str, Any]:
        """The ``ls`` report (schemas/report_ls.schema.json)."""
        return {
            "status": "ok",
            "uri": str(self.uri),
            "runs_root": str(self.runs_root) if self.runs_root is not None else None,
            "counts": self.counts(),
            "bytes": sum(a.bytes or 0 for a in self.artifacts),
            "artifacts": [a.to_dict() for a in self.artifacts],
            "other": {"objects": len(self.other), "bytes": sum(i.size for i in self.other),
                      "sample": [i.key for i in self.other[:SAMPLES]]},
        }


def list_archive(store: ObjectStore, uri: StoreURI) -> Listing:
    """Every archived artifact under ``uri`` in ``store`` (the store ``open_uri`` gives for it)."""
    # A file:// URI is its own root: its path's segments place the keys in the archive's layout.
    base = uri.bucket.strip("/").split("/") if uri.scheme == "file" else []
    key_prefix = "" if uri.scheme == "file" else segment_prefix(uri.key, what=f"prefix of {uri}")
    workers = max(1, store.concurrency)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckptflow-ls") as pool:
        # Each declaration's GET starts as soon as its key is listed, so the reads overlap the next pages.
        artifacts, other = _group(store.iter_list(key_prefix), base, uri,
                                  lambda art: pool.submit(_get, store, art, DECLARATION_FILENAME))
        list(pool.map(lambda a: _judge(store, a), artifacts))
    return Listing(uri, artifacts, other)


def _group(infos: Iterable[ObjectInfo], base: list[str], uri: StoreURI,
           read_declaration: Callable[[ArchivedArtifact], Future[bytes]],
           ) -> tuple[list[ArchivedArtifact], list[ObjectInfo]]:
    found: dict[str, ArchivedArtifact] = {}
    other: list[ObjectInfo] = []
    for info in infos:
        key = info.key.split("/")
        segments = base + key
        at = next((i for i in range(len(segments) - 2)
                   if segments[i] == ARTIFACTS_DIR and ITER_DIR_RE.fullmatch(segments[i + 1])), None)
        if at is None:
            other.append(info)
            continue
        end = at + 2 - len(base)  # segments of the key that name the artifact's prefix
        if end < 0:
            raise UsageError(f"{uri} lies inside the artifact {'/'.join(segments[:at + 2])}",
                             remedy="list the artifact's own directory, or a directory above it")
        prefix = "/".join(key[:end])
        art = found.get(prefix)
        if art is None:
            name = segments[at + 1]
            run = "/".join(segments[max(0, at - RUN_DEPTH):at])
            art_uri = (f"file:///{'/'.join(segments[:at + 2])}" if uri.scheme == "file"
                       else f"{uri.scheme}://{uri.bucket}/{prefix}")
            art = found[prefix] = ArchivedArtifact(run, name, int(ITER_DIR_RE.fullmatch(name).group(1)), art_uri,
                                                   prefix, {})
        rel = "/".join(key[end:])
        art.objects[rel] = info
        if rel == DECLARATION_FILENAME:
            art.declaration = read_declaration(art)
    return sorted(found.values(), key=lambda a: (a.run, a.iteration, a.uri)), sorted(other, key=lambda i: i.key)


def _judge(store: ObjectStore, art: ArchivedArtifact) -> None:
    """Read the artifact's declaration (or a legacy one's manifest) and set its state; never raises for
    what one artifact holds, so one bad prefix never hides the others."""
    try:
        if DECLARATION_FILENAME in art.objects:
            _judge_declared(store, art)
        elif MANIFEST_FILENAME in art.objects:
            _judge_legacy(store, art)
        else:
            art.detail = (f"{art.uri} holds {len(art.objects)} object(s) but no {DECLARATION_FILENAME} or "
                          f"{MANIFEST_FILENAME}: not published by ckptflow")
    except (CkptflowError, OSError) as exc:
        art.state, art.detail = CORRUPT, str(exc)


def _get(store: ObjectStore, art: ArchivedArtifact, filename: str) -> bytes:
    # One record per artifact, thousands per listing: the store's cheaper small reads where it has them
    # (the same bytes or the same error as get_bytes).
    reader = store.small_gets or store
    return reader.get_bytes(object_key(art.prefix, filename), max_bytes=MAX_RECORD_BYTES)


def _judge_declared(store: ObjectStore, art: ArchivedArtifact) -> None:
    data = art.declaration.result() if art.declaration is not None else _get(store, art, DECLARATION_FILENAME)
    declaration = parse_declaration(data, what=f"{DECLARATION_FILENAME} at {art.uri}")
    sizes = payload_sizes(declaration.files)
    art.files, art.bytes = len(sizes), sum(sizes)
    if declaration.iteration != art.iteration:
        art.state, art.detail = CORRUPT, (f"{DECLARATION_FILENAME} at {art.uri} is for iteration "
                                          f"{declaration.iteration}: the archive is misplaced; check how it was copied")
        return
    art.manifest_sha256 = declaration.manifest_sha256
    manifest = art.objects.get(MANIFEST_FILENAME)
    declared = {f.path: f for f in declaration.files}
    if manifest is None:
        art.state = "incomplete"
        art.detail = (f"{art.uri} has a declaration but no {MANIFEST_FILENAME}: its publication was interrupted or "
                      "is running; rerun `ckptflow publish` for it from its local copy")
        return
    if manifest.size != declared[MANIFEST_FILENAME].size:
        art.state, art.detail = CORRUPT, (f"{MANIFEST_FILENAME} at {art.uri} has {manifest.size} bytes, the "
                                          f"declaration says {declared[MANIFEST_FILENAME].size}: republish it")
        return
    problems = [f"{path} missing" if info is None else f"{path} has {info.size} bytes, declared {entry.size}"
                for path, entry in declared.items()
                if (info := art.objects.get(path)) is None or info.size != entry.size]
    if problems:
        art.state = "damaged"
        art.detail = (f"{len(problems)} of {len(declared)} declared files of {art.uri} are not as declared ("
                      f"{'; '.join(problems[:3])}): run `ckptflow verify` on a local copy, or republish it")
    else:
        art.state = "committed"


def _judge_legacy(store: ObjectStore, art: ArchivedArtifact) -> None:
    data = _get(store, art, MANIFEST_FILENAME)
    try:
        manifest = parse_manifest(data, what=f"{MANIFEST_FILENAME} at {art.uri}")
    except LegacyRecord as exc:
        art.state, art.detail = "legacy", str(exc)
        return
    art.manifest_sha256 = sha256_bytes(data)
    files = manifest.physical_files()
    art.files, art.bytes = len(files), sum(f.size for f in files)
    art.state = "legacy"
    art.detail = (f"{art.uri} has a manifest but no {DECLARATION_FILENAME} (an older publisher): fetch checks "
                  "each file by HEAD; republish it to bind every file by digest")
