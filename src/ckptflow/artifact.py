"""The local artifact directory: ``<run>/<ts>/checkpoint_artifacts/iter_NNNNNN/``.

An artifact holds selected components (a consolidated ``model.pt``, DCP shard directories such as
``optim/`` with ``.metadata`` and ``__R_0.distcp``, ``trainer.pt`` …) and the native manifest
``.posttrain-checkpoint-artifact.json``, which is written last: a directory without it is an
interrupted save, never a committed artifact.

A merge writes its manifest just before its completion record ``.merge-complete.json``; a directory
holding the merge's in-progress marker ``.merge-in-progress.json`` and no completion record is a merge
in progress (or one killed in progress) whatever else it holds, never a committed artifact
(``merge_in_progress``): discovery skips it and publish refuses it, until the merge is rerun. A marker
beside the record that names the model.pt now in place (a merge killed after its record, before it
removed the marker) is stale: merge, publish and prune remove it (``clear_stale_merge_marker``).

``seal_artifact`` commits a manifest for components that some other program already wrote; it is how
checkpoints from other trainers enter ckptflow.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import __version__
from .digest import hash_files
from .errors import CkptflowError, NotFound, Refused, UnsafePath, UsageError
from .fsutil import resolve_inside, restorable_name_problem, safe_relpath, walk_files
from .records import manifest as manifest_record
from .records import merge_progress, merge_record
from .records import receipt as receipt_record

ITER_DIR_RE = re.compile(r"^iter_(\d+)$")
COMPONENT_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
ARTIFACTS_DIR = "checkpoint_artifacts"  # a run's artifacts: <run>/checkpoint_artifacts/iter_N
RUN_DEPTH = 4  # a run is named by its last segments: <project>/<group>/<run>/<ts>


def find_runs(root: Path | str) -> dict[str, Path]:
    """Every directory below ``root`` holding ``checkpoint_artifacts/``, by its path relative to ``root``.

    A run's own subdirectories (its full checkpoints, its artifacts) are not walked, nor are hidden ones
    (temporaries, ``.snakemake``): the cost is one listing per directory above the runs, however many
    files the checkpoints hold.
    """
    root = Path(root)
    runs: dict[str, Path] = {}
    for dirpath, dirnames, _ in os.walk(root):
        if ARTIFACTS_DIR in dirnames:
            here = Path(dirpath)
            runs[here.relative_to(root).as_posix()] = here
            dirnames[:] = []
        else:
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
    return runs


def committed_artifacts(runs_root: Path | str) -> list[tuple[str, str]]:
    """``(run, iter_dir_name)`` of every committed artifact under ``runs_root`` (``is_committed``), sorted;
    the runs are ``find_runs``'s (what ``ckptflow status`` shows, and what the workflow publishes)."""
    found = []
    for run, run_dir in find_runs(runs_root).items():
        try:
            names = os.listdir(run_dir / ARTIFACTS_DIR)
        except OSError:  # removed meanwhile, or not a directory
            continue
        found += [(run, name) for name in names
                  if ITER_DIR_RE.match(name) and is_committed(run_dir / ARTIFACTS_DIR / name)]
    return sorted(found)


def is_committed(artifact_dir: Path | str) -> bool:
    """The manifest is there and no merge is in progress in the directory (``merge_in_progress``)."""
    return manifest_record.path_in(artifact_dir).is_file() and not merge_in_progress(artifact_dir)


def changed_payloads(artifact_dir: Path | str, manifest: manifest_record.Manifest | None = None, *,
                     progress: bool | None = False) -> list[str]:
    """Why each payload file on disk is not the one the manifest committed (``"<path> has N bytes, the
    manifest says M"``, ``"<path> was rewritten after the commit (sha256 ...)"``); [] when every one present
    is. A file pruned away is not judged here (``status``, ``unrestored``).

    The cheap check, one ``stat`` per file: its size must be the manifest's, and its ``st_mtime_ns`` no later
    than the manifest's own. The manifest is written last and nothing of ours writes a payload after it
    (a restore stamps each file it puts back with the manifest's time), while any write to a file, a
    truncate-and-rewrite in place above all, sets its mtime to the file system's now. Only a file that
    fails the time check is hashed, and judged by its SHA-256: a copy that kept no times (``rsync`` without
    ``-t``), or a shard another host's clock stamped, costs a read, never a false verdict. Not seen: a
    rewrite of the same size within the manifest's own timestamp tick, or one whose mtime was set back on
    purpose (``touch -d``); ``verify --read-data`` and ``publish`` hash everything."""
    art = Path(artifact_dir)
    committed = os.stat(manifest_record.path_in(art)).st_mtime_ns
    manifest = manifest if manifest is not None else manifest_record.read_manifest(art)
    changed, suspects = [], {}
    for entry in manifest.physical_files():
        try:
            st = os.lstat(art / entry.path)
        except FileNotFoundError:
            continue
        if st.st_size != entry.size:
            changed.append(f"{entry.path} has {st.st_size} bytes, the manifest says {entry.size}")
        elif st.st_mtime_ns > committed and entry.sha256 is not None:
            suspects[entry.path] = entry.sha256
    if suspects:
        got = hash_files(art, sorted(suspects), progress=progress, desc="sha256 (modified after the commit)")
        changed += [f"{rel} was rewritten after the commit (sha256 {got[rel].sha256[:12]}..., the manifest says "
                    f"{want[:12]}...)" for rel, want in sorted(suspects.items()) if got[rel].sha256 != want]
    return sorted(changed)


def changed_remedy(artifact_dir: Path | str) -> str:
    """What to do about an artifact whose payloads ``changed_payloads`` names: restore from its archive when a
    receipt says there is one (a restore never overwrites a local file), else it is lost and is set aside."""
    art = Path(artifact_dir)
    if receipt_record.path_in(art).is_file():
        return (f"move the changed file(s) out of {art} (they are not the committed bytes), then `ckptflow restore "
                f"--artifact-dir {art}` puts the archived ones back")
    return (f"its committed bytes are archived nowhere and cannot be recovered: move {art} out of {ARTIFACTS_DIR}/ "
            "(keep what you need of it) and resume from the newest intact artifact, or train under a new run directory")


def merge_in_progress(artifact_dir: Path | str) -> bool:
    """A merge is writing ``artifact_dir`` or was killed while it did: its in-progress marker is there and
    its completion record is not (a manifest it already wrote does not commit the directory)."""
    marker = merge_progress.path_in(artifact_dir)
    record = merge_record.path_in(artifact_dir)
    return os.path.lexists(marker) and not os.path.lexists(record)


def stale_merge_marker(artifact_dir: Path | str) -> Path | None:
    """The in-progress marker when its merge committed and was killed before removing it, else None.

    Proof: the completion record is there and the marker's last file (the temporary that merge renames to
    ``model.pt`` after removing the previous record) is the file now at a path the record lists as an
    output. A merge still in progress removed the previous record before that rename, so a record and the
    marker's file in place together mean its own record was written. Read-only."""
    artifact_dir = Path(artifact_dir)
    marker = merge_progress.path_in(artifact_dir)
    if not os.path.lexists(marker):
        return None
    try:
        record = merge_record.read_merge_record(artifact_dir)
        written = merge_progress.read_merge_progress(marker).files[-1]
    except (CkptflowError, OSError, IndexError):
        return None
    for entry in record.outputs:
        try:
            if merge_progress.FileState.of(artifact_dir / entry.path) == written:
                return marker
        except OSError:
            continue
    return None


def clear_stale_merge_marker(artifact_dir: Path | str) -> bool:
    """Remove the in-progress marker a killed merge left beside its committed record (``stale_merge_marker``)."""
    marker = stale_merge_marker(artifact_dir)
    if marker is None:
        return False
    marker.unlink(missing_ok=True)  # its merge committed: the record, not the marker, governs the directory
    return True


def archived_artifact_of(path: Path | str) -> Path | None:
    """The committed artifact whose manifest lists ``path`` as a payload and whose receipt is its own (the
    bytes are archived: a payload missing there was pruned, and ``ckptflow restore`` brings it back); None
    when no ``iter_*`` directory above ``path`` is such an artifact. Reads two small records, no store."""
    target = Path(os.path.abspath(path))
    for artifact_dir in target.parents:
        if not ITER_DIR_RE.match(artifact_dir.name):
            continue
        try:
            manifest = manifest_record.read_manifest(artifact_dir)
        except (CkptflowError, OSError, ValueError):
            return None
        listed = target.relative_to(artifact_dir).as_posix() in {e.path for e in manifest.physical_files()}
        return artifact_dir if listed and receipt_record.belonging_receipt(artifact_dir) is not None else None
    return None


def iteration_from_dir(artifact_dir: Path) -> int:
    """The N of an ``iter_N`` directory name; refuses any other name."""
    m = ITER_DIR_RE.match(Path(artifact_dir).name)
    if not m:
        raise UsageError(
            f"artifact directory {artifact_dir} is not named iter_<N>",
            remedy="artifacts live in checkpoint_artifacts/iter_NNNNNN/",
        )
    return int(m.group(1))


@dataclass(frozen=True)
class ComponentSpec:
    name: str
    path: str  # relative to the artifact directory


def parse_component_spec(text: str) -> ComponentSpec:
    """``NAME=PATH`` from the command line."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise UsageError(f"component {text!r} is not NAME=PATH", remedy="for example model=model.pt optim=optim")
    if not COMPONENT_NAME_RE.match(name):
        raise UsageError(f"component name {name!r} may only use letters, digits, '_', '.', '-'")
    safe_relpath(path.rstrip("/"), what=f"component {name} path")
    return ComponentSpec(name=name, path=path.rstrip("/"))


def seal_artifact(
    artifact_dir: Path | str,
    iteration: int,
    components: list[ComponentSpec],
    *,
    progress: bool | None = None,
    before_commit: Callable[[], None] | None = None,
) -> manifest_record.Manifest:
    """``seal_or_confirm`` without saying whether the manifest was already there."""
    return seal_or_confirm(artifact_dir, iteration, components, progress=progress, before_commit=before_commit)[0]


def seal_or_confirm(
    artifact_dir: Path | str,
    iteration: int,
    components: list[ComponentSpec],
    *,
    progress: bool | None = None,
    before_commit: Callable[[], None] | None = None,
) -> tuple[manifest_record.Manifest, bool]:
    """Hash the named components and commit the native manifest last; returns (manifest, already sealed).

    A directory already sealed with exactly these components, files, sizes and digests is confirmed
    (``True``, nothing written), as publish and fetch confirm what they already did. Refuses (nothing
    written) when a manifest exists that records anything else, when the directory is not ``iter_*``
    matching ``iteration``, when a component is missing, escapes the directory or is/contains a symlink,
    or when two components overlap. ``before_commit`` runs after every digest, right before the manifest is
    written (a save drops its in-progress record there, as ``write_artifact`` does).
    """
    artifact_dir = Path(artifact_dir)
    if not artifact_dir.is_dir():
        raise NotFound(f"artifact directory {artifact_dir} does not exist", remedy="create it and write the components first")
    if artifact_dir.is_symlink():
        raise UnsafePath(f"artifact directory {artifact_dir} is a symlink", remedy="pass the real directory")
    dir_iteration = iteration_from_dir(artifact_dir)
    if dir_iteration != iteration:
        raise Refused(
            f"--iteration {iteration} does not match the directory name {artifact_dir.name}",
            remedy=f"pass --iteration {dir_iteration} or seal the right directory",
        )
    manifest_path = manifest_record.path_in(artifact_dir)
    already = manifest_path.exists() or manifest_path.is_symlink()
    if not components:
        raise UsageError("no components given", remedy="name at least one NAME=PATH")
    names = [c.name for c in components]
    if len(set(names)) != len(names):
        raise UsageError(f"component names repeat: {sorted(n for n in set(names) if names.count(n) > 1)}")

    # Resolve every component and list its files before hashing anything.
    plan: list[tuple[ComponentSpec, str, list[str]]] = []  # (spec, format, files relative to artifact_dir)
    for spec in components:
        target = resolve_inside(artifact_dir, spec.path, what=f"component {spec.name}")
        if not target.exists():
            raise NotFound(f"component {spec.name}: {target} does not exist", remedy="write it before sealing")
        if target.is_dir():
            files = [f"{spec.path}/{rel}" for rel in walk_files(target)]
            if not files:
                raise Refused(f"component {spec.name}: directory {target} is empty", remedy="a DCP component needs its shard files")
            plan.append((spec, "dcp", files))
        elif target.is_file():
            plan.append((spec, "file", [spec.path]))
        else:
            raise UnsafePath(f"component {spec.name}: {target} is not a regular file or directory")
    _refuse_overlaps(plan)
    refuse_unrestorable_names(artifact_dir, [f for _, _, files in plan for f in files])

    digests = hash_files(artifact_dir, [f for _, _, files in plan for f in files], progress=progress, desc="seal sha256")
    comp_dicts: dict[str, dict] = {}
    for spec, fmt, files in plan:
        if fmt == "file":
            d = digests[spec.path]
            comp_dicts[spec.name] = {"format": "file", "path": spec.path, "size": d.size, "sha256": d.sha256}
        else:
            prefix = spec.path + "/"
            comp_dicts[spec.name] = {
                "format": "dcp",
                "path": spec.path,
                "files": [
                    {"path": f[len(prefix):], "size": digests[f].size, "sha256": digests[f].sha256} for f in files
                ],
            }
    record = manifest_record.Manifest.from_dict(
        {
            "schema": manifest_record.SCHEMA,
            "iteration": iteration,
            "components": comp_dicts,
            "producer": {"tool": "ckptflow seal", "version": __version__},
        }
    )
    if already:
        return _confirm_sealed(manifest_path, record), True
    if before_commit is not None:
        before_commit()
    manifest_record.write_manifest(artifact_dir, record)
    return record, False


def _confirm_sealed(manifest_path: Path, record: manifest_record.Manifest) -> manifest_record.Manifest:
    """The committed manifest when it records exactly ``record``'s components and bytes, else ``Refused``."""
    try:
        existing = manifest_record.read_manifest(manifest_path)
    except CkptflowError as exc:
        differs = f"it cannot be read ({exc})"
    else:
        def comps(m: manifest_record.Manifest) -> dict:
            return {name: c.to_dict() for name, c in m.components.items()}

        mine, theirs = comps(record), comps(existing)
        if existing.iteration == record.iteration and mine == theirs:
            return existing
        if sorted(mine) != sorted(theirs):
            differs = f"it records components {sorted(theirs)}, not {sorted(mine)}"
        else:
            changed = sorted(n for n in mine if mine[n] != theirs[n])
            differs = f"component(s) {changed} differ from the files on disk (sizes or digests)"
    raise Refused(
        f"{manifest_path} already exists: the artifact is already committed and {differs}",
        remedy="a committed manifest is never replaced; seal into a new iter_* directory",
    )


def refuse_unrestorable_names(artifact_dir: Path, paths: list[str]) -> None:
    """Seal and publish accept only names fetch can write back: each at most ``fsutil.NAME_MAX`` bytes
    (fetch's own temporaries are short, fixed-length names), no two equal under case folding or NFC."""
    problem = restorable_name_problem(paths)
    if problem is not None:
        raise Refused(f"{artifact_dir}: {problem}; fetch could not restore such an artifact",
                      remedy="rename the files (and save or seal the artifact again) so that every name fits and no "
                      "two differ only in case or Unicode form")


def _refuse_overlaps(plan: list[tuple[ComponentSpec, str, list[str]]]) -> None:
    owner: dict[str, str] = {}
    for spec, _, files in plan:
        for f in files:
            if f in owner:
                raise UsageError(f"components {owner[f]} and {spec.name} both contain {f}", remedy="name each file once")
            owner[f] = spec.name
