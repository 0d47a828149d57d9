"""The workflow's configuration in ``--config`` terms: typing, validation, and what a target needs.

Owns, for the Snakemake workflow (``workflow.plan``, ``workflow.triggers`` and ``workflow.steps`` import it):

- ``checked_config``: command-line spellings typed (``normalise_config``), then the schema; an unknown key
  is named with the closest known one (``bucekt`` → ``bucket``), any other schema error in one line.
- The checks a target needs before Snakemake plans a job, each naming the key and its remedy as
  ``--config KEY=VALUE`` with the candidates found on disk: ``require_runs_root``, ``require_base``,
  ``require_bucket``, ``require_credentials``, ``require_merge_recipe``, ``require_experts``, ``resolve_target``
  (the run and the iteration). The plan (``workflow.plan``) calls them while Snakemake plans (so a dry-run
  refuses what the run would) and the step functions call the same ones.
- ``refuse_overrides_as_targets``: a ``--config`` override placed after ``--`` (taken as a target).
- ``exit_with``: the one line Snakemake shows for such a refusal (planning, or inside a job, where the
  remedy's command-line flags are spelled as ``--config`` keys by ``config_remedy``); details go to the
  job log.

It reads the file system only (never a store) and writes nothing.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import jsonschema

from ..artifact import ARTIFACTS_DIR, ITER_DIR_RE, archived_artifact_of, committed_artifacts, find_runs
from ..errors import CkptflowError, UsageError
from ..jsonio import load_schema
from ..store import StoreURI
from ..store.credentials import ENV_VAR as CREDENTIALS_ENV
from ..store.credentials import resolve_credentials_path
from ..store.open import BUCKET_ENV, credentials_for
from ..store.uri import parse_store_uri

RUN_REMEDY = "pass --config run=<project>/<group>/<run>/<ts> (the run's path under runs_root)"
README = "config/README.md"
_SHOWN = 6  # candidates listed in a message; the rest are counted

F = TypeVar("F", bound=Callable[..., Any])


def _listed(items: list[str]) -> str:
    more = f", … ({len(items) - _SHOWN} more)" if len(items) > _SHOWN else ""
    return ", ".join(items[:_SHOWN]) + more


# --------------------------------------------------------------------------------------------- typing


def iteration_name(iteration: int) -> str:
    """The directory name of a new artifact, stage or teacher for ``iteration``: ``iter_NNNNNN``."""
    return f"iter_{iteration:06d}"


def parse_iteration(value: Any, *, what: str = "config iter") -> int:
    """``300``, ``"300"`` or ``"iter_000300"`` as an int; anything else is refused by name."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    text = str(value).strip() if isinstance(value, str) else ""
    m = ITER_DIR_RE.match(text)
    if m:
        return int(m.group(1))
    if text.isdigit():
        return int(text)
    raise UsageError(f"{what} is {value!r}, not an iteration number", remedy="pass --config iter=300")


def _as_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise UsageError(f"{what} is {value!r}, not true or false")


def _as_int(value: Any) -> Any:
    """A string of digits as an int; anything else as it is (the schema names a wrong type)."""
    return int(value) if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]+\s*", value) else value


def _recipe(raw: Any, key: str) -> Any:
    if not isinstance(raw, Mapping):
        return raw  # the schema names the problem
    recipe = dict(raw)
    if isinstance(recipe.get("experts"), str):  # a nested --config override arrives as a string
        recipe["experts"] = [e.strip() for e in recipe["experts"].split(",") if e.strip()]
    if isinstance(recipe.get("lam"), str) and recipe["lam"].strip() not in ("", "null", "None"):
        try:
            recipe["lam"] = float(recipe["lam"])
        except ValueError:
            raise UsageError(f"config merge.{key}.lam is {recipe['lam']!r}, not a number") from None
    elif recipe.get("lam") in ("null", "None", ""):
        recipe["lam"] = None
    if "force" in recipe:
        recipe["force"] = _as_bool(recipe["force"], f"config merge.{key}.force")
    return recipe


def normalise_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration with command-line spellings made typed, before schema validation.

    ``--config iter=300`` arrives as an int, but nested overrides (``--config 'merge={...}'``) arrive as
    strings, and YAML keys of ``merge`` may be ints: iterations become ints, ``merge`` keys strings of
    the iteration number, numbers and booleans of nested keys their types.
    """
    out = dict(config)
    if out.get("iter") is not None:
        out["iter"] = parse_iteration(out["iter"])
    if isinstance(out.get("run"), str):
        out["run"] = out["run"].strip("/") or None
    if isinstance(out.get("merge"), Mapping):
        out["merge"] = {str(parse_iteration(k, what=f"config merge key {k!r}")): _recipe(v, str(k))
                        for k, v in out["merge"].items()}
    if isinstance(out.get("materialize"), Mapping):
        mat = dict(out["materialize"])
        for key in ("min_tensors", "expect_tensors"):
            if key in mat:
                mat[key] = _as_int(mat[key])
        for key in ("verify", "force"):
            if key in mat:
                mat[key] = _as_bool(mat[key], f"config materialize.{key}")
        out["materialize"] = mat
    if isinstance(out.get("prune"), Mapping):
        prune = dict(out["prune"])
        if "keep_newest" in prune:
            prune["keep_newest"] = _as_int(prune["keep_newest"])
        if prune.get("keep_free") is not None and not isinstance(prune["keep_free"], str):
            prune["keep_free"] = str(prune["keep_free"])  # a YAML number: refused by _check_keep_free (no unit)
        out["prune"] = prune
    return out


def merge_recipe(config: Mapping[str, Any], iteration: int) -> dict[str, Any] | None:
    """The merge recipe of ``iteration`` in a normalised configuration, or None."""
    recipes = config.get("merge") or {}
    return recipes.get(str(iteration))


def require_merge_recipe(config: Mapping[str, Any], iteration: int) -> dict[str, Any]:
    """The merge recipe of ``iteration``; without one, a ``UsageError`` that lists the recipes there are."""
    recipe = merge_recipe(config, iteration)
    if recipe is None:
        recipes = sorted(int(k) for k in config.get("merge") or {})
        listed = f" (recipes: {', '.join(map(str, recipes))})" if recipes else ""
        raise UsageError(f"config merge has no recipe for iteration {iteration}{listed}",
                         remedy=f"add one under merge: in config/config.yaml (see {README})")
    return recipe


def _unknown_key(error: jsonschema.ValidationError, where: str) -> UsageError:
    """An ``additionalProperties`` error as the unknown key and the closest known one."""
    schema, instance = error.schema, error.instance
    known = list(schema.get("properties", {}))
    patterns = [re.compile(p) for p in schema.get("patternProperties", {})]
    unknown = [k for k in instance if k not in known and not any(p.search(str(k)) for p in patterns)]
    key = str(unknown[0]) if unknown else "?"
    close = difflib.get_close_matches(key, known, n=1)
    full = f"{where}{key}"
    if close:
        return UsageError(f"unknown config key {full!r} (did you mean {where + close[0]!r}?)",
                          remedy=f"spell it {where}{close[0]} (every key is described in {README})")
    what = f"known keys: {', '.join(known)}" if known else f"keys must match {', '.join(p.pattern for p in patterns)}"
    return UsageError(f"unknown config key {full!r} ({what})", remedy=f"remove it (every key is described in {README})")


def checked_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``normalise_config`` and then the schema, each problem one ``UsageError`` naming the key: an unknown
    key with the closest known one, a wrong value with its key and the schema's words (not a dump)."""
    out = normalise_config(config)
    validator = jsonschema.Draft202012Validator(load_schema("config"))
    errors = sorted(validator.iter_errors(out), key=lambda e: (e.validator != "additionalProperties",
                                                               list(map(str, e.absolute_path))))
    if not errors:
        _check_keep_free(out)
        return out
    error = jsonschema.exceptions.best_match([errors[0]]) if errors[0].validator != "additionalProperties" else errors[0]
    path = ".".join(map(str, error.absolute_path))
    if error.validator == "additionalProperties":
        return _raise(_unknown_key(error, f"{path}." if path else ""))
    value = json.dumps(error.instance, default=str)
    key = path or "(the configuration)"
    return _raise(UsageError(f"config {key} is {value[:80]}: {error.message[:160]}",
                             remedy=f"{config_flag(path, '...')} (see {README})" if path else f"see {README}"))


def _raise(exc: CkptflowError) -> NoReturn:
    raise exc


def _check_keep_free(config: Mapping[str, Any]) -> None:
    """config ``prune.keep_free`` read as ``prune_all`` will read it (``archive.keep_free.parse_target``), a
    wrong one refused here by its key, before any planning."""
    from ..archive.keep_free import parse_target

    value = (config.get("prune") or {}).get("keep_free")
    if value is None:
        return
    try:
        parse_target(value)
    except UsageError:
        raise UsageError(f"config prune.keep_free is {value!r}: not a size with a unit (20G, 512M, 1.5T, 1000B; "
                         "binary units) nor a percentage of the file system of runs_root (15%)",
                         remedy=config_flag("prune.keep_free", '"20G"') + ", or null to prune every verified "
                         f"artifact (see {README})") from None


# --------------------------------------------------------------------------------------------- remedies


def config_flag(key: str, value: str) -> str:
    """``--config KEY=VALUE``; a nested key is overridden through its top-level mapping."""
    top, _, rest = key.partition(".")
    if not rest:
        return f"pass --config {top}={value}"
    if top == "merge":
        return f"set {rest.split('.', 1)[-1]}: {value} in the merge recipe {rest.split('.', 1)[0]} of the config"
    return f"pass --config '{top}={{\"{rest}\": {value}}}'"


# The command-line flags a library remedy may name, and the configuration key that sets them in the
# workflow; "--force" depends on the step (materialize's option, or the merge recipe's).
_FLAG_KEYS = {"--bucket": "bucket", "--credentials": "credentials", "--base": "base",
              "--min-tensors": "materialize.min_tensors", "--expect-tensors": "materialize.expect_tensors"}
_FORCE_KEYS = {"materialize": "materialize.force", "merge": "merge.<iter>.force"}


def config_remedy(remedy: str, step: str | None = None) -> str:
    """A library remedy with its command-line flags spelled as the workflow's keys (``pass --bucket B``
    → ``pass --config bucket=B``), so a failed job says what to change in the workflow's terms."""
    keys = dict(_FLAG_KEYS)
    if step in _FORCE_KEYS:
        keys["--force"] = _FORCE_KEYS[step]

    def swap(m: re.Match[str]) -> str:
        flag, value = m.group(1), m.group(2) or "..."
        key = keys[flag]
        if "." not in key:
            return f"--config {key}={value}"
        return config_flag(key, "true" if flag == "--force" else value).removeprefix("pass ")

    pattern = r"(?<![\w-])(" + "|".join(map(re.escape, keys)) + r")(?![\w-])(?:[ =]([A-Z][A-Z_]*|[0-9]+)\b)?"
    out = re.sub(pattern, swap, remedy)
    return re.sub(r"\bpass pass\b", "pass", out)


def error_line(exc: BaseException, step: str | None = None) -> str:
    """The one line Snakemake prints for ``exc``: message and remedy in ``--config`` terms."""
    if isinstance(exc, CkptflowError):
        remedy = f"; {config_remedy(exc.remedy, step)}" if exc.remedy else ""
        return f"{exc.message}{remedy}".replace("\n", " ")
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")


def exit_with(exc: BaseException, step: str | None = None, *, log: str | None = None) -> NoReturn:
    """Print ``exc`` as one line on stderr and exit 1, without a traceback (Snakemake prints one for any
    exception raised while it parses or plans; a SystemExit ends it with nothing more). ``log`` names the
    job log that holds the details."""
    where = f" (details: {log})" if log else ""
    sys.stderr.write(f"ckptflow: {error_line(exc, step)}{where}\n")
    sys.stderr.flush()
    raise SystemExit(1)


def one_line_errors(fn: F) -> F:
    """Wrap a Snakefile input function: a ckptflow error ends Snakemake with its one line (``exit_with``)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CkptflowError as exc:
            exit_with(exc)

    return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------- checks


# A word Snakemake took as a target although it was meant as a configuration override: an option, or KEY=VALUE.
_OVERRIDE_LIKE = re.compile(r"-.*|[A-Za-z_][A-Za-z0-9_.]*=.*", re.DOTALL)


def words_after_double_dash(argv: list[str]) -> list[str]:
    """The words of a command line after ``--``: Snakemake takes every one of them as a target."""
    return argv[argv.index("--") + 1:] if "--" in argv else []


def refuse_overrides_as_targets(targets: Iterable[str]) -> None:
    """A target that looks like a configuration override (an option such as ``--config``, or ``KEY=VALUE``)
    was meant as one: ``-- materialize_teacher --config iter=300`` (every word after ``--`` is a target) or
    ``materialize_teacher iter=300`` asks Snakemake to build files of those names and leaves config iter
    unset. Refused before planning, saying where the override goes. The Snakefile passes the words after
    ``--`` while it is read (Snakemake's parsed targets are not known then) and the parsed targets once an
    iteration-scoped target is planned."""
    odd = list(dict.fromkeys(t for t in targets if _OVERRIDE_LIKE.fullmatch(t)))
    if not odd:
        return
    overrides = [t for t in odd if not t.startswith("-")]
    example = " ".join(overrides) if overrides else "KEY=VALUE"
    raise UsageError(
        f"target(s) {', '.join(repr(t) for t in odd)} look like a --config override, but Snakemake took them "
        "as targets to build (every word after `--` is a target), so the override was not applied",
        remedy=f"put it after --config, before `--` and the target: snakemake ... --configfile site.yaml "
        f"--config {example} -- TARGET")


def require_experts(experts: Iterable[str], iteration: int) -> None:
    """config ``merge.<iter>.experts``: every file is there. One pruned from its archived artifact is named
    so, with the restore that brings it back (the recipe is right; the bytes are in the archive)."""
    missing = [e for e in experts if not os.path.isfile(e)]
    if not missing:
        return
    pruned = {e: d for e in missing if (d := archived_artifact_of(e)) is not None}
    if pruned:
        listed = ", ".join(f"{e} (artifact {d})" for e, d in pruned.items())
        restores = " and ".join(f"`ckptflow restore --artifact-dir {d}`" for d in dict.fromkeys(pruned.values()))
        raise UsageError(
            f"config merge.{iteration}.experts: {listed} {'was' if len(pruned) == 1 else 'were'} pruned after "
            "the archive was verified (the manifest and receipt stay)",
            remedy=f"restore first: `snakemake restore_all` (every pruned artifact of the runs), or {restores}; "
            "then run merge_experts again")
    raise UsageError(f"config merge.{iteration}.experts: no such file {', '.join(missing)}",
                     remedy="fix the expert paths of the recipe (relative to the working directory)")


def require_runs_root(runs_root: str) -> Path:
    """config ``runs_root``: an existing directory (a typo would otherwise find no artifact, silently)."""
    path = Path(runs_root)
    if not path.is_dir():
        raise UsageError(f"config runs_root {runs_root} does not exist" if not path.exists() else
                         f"config runs_root {runs_root} is not a directory",
                         remedy="pass --config runs_root=<the directory holding <project>/<group>/<run>/<ts>/"
                         f"{ARTIFACTS_DIR}>")
    return path


def require_base(base: str | None, *, key: str = "base") -> Path:
    """The Hugging Face base directory of config ``key``: set, a directory, holding ``config.json``."""
    if not base:
        raise UsageError(f"config {key} is not set: a teacher (or a tv merge) is built against a base",
                         remedy=config_flag(key, "<Hugging Face base directory>"))
    path = Path(base)
    if not path.is_dir():
        raise UsageError(f"config {key} {base} does not exist" if not path.exists() else
                         f"config {key} {base} is not a directory",
                         remedy=config_flag(key, "<Hugging Face base directory>"))
    if not (path / "config.json").is_file():
        raise UsageError(f"config {key} {base} holds no config.json: not a Hugging Face model directory",
                         remedy=config_flag(key, "<the directory holding config.json>"))
    return path


def require_bucket(bucket: str | None) -> StoreURI:
    """The configured bucket (``null``: ``$CKPTFLOW_BUCKET``) as a store URI; a bare name means S3."""
    bucket = bucket or os.environ.get(BUCKET_ENV) or None
    if not bucket:
        raise UsageError(f"config bucket is not set (nor {BUCKET_ENV}): publication and the archive need it",
                         remedy="pass --config bucket=s3://B (or gs://B, file:///DIR)")
    try:
        uri = parse_store_uri(bucket, what="config bucket") if "://" in bucket else StoreURI("s3", bucket, "")
    except CkptflowError as exc:
        raise UsageError(exc.message, remedy="pass --config bucket=s3://B (or gs://B, file:///DIR)") from None
    if uri.key:
        raise UsageError(f"config bucket {bucket!r} names a key inside the bucket",
                         remedy=f"pass --config bucket={uri.scheme}://{uri.bucket} (prefixes come from runs_root)")
    return uri


def require_credentials(credentials: str | None, schemes: Iterable[str]) -> None:
    """The credentials of config ``credentials`` (``null``: ``$CKPTFLOW_CREDENTIALS``), loaded as the steps
    load them (``credentials_for``) for stores of ``schemes``: when one needs credentials and a file is set,
    it exists and parses; none set is left to the store."""
    if resolve_credentials_path(credentials) is None:
        return
    source = "config credentials" if credentials else f"${CREDENTIALS_ENV}"
    for scheme in sorted(set(schemes)):
        try:
            credentials_for(f"{scheme}://", credentials)
        except CkptflowError as exc:
            raise UsageError(f"{source}: {exc.message}",
                             remedy="pass --config credentials=<credentials JSON file> "
                             '({"aws_access_key_id", "aws_secret_access_key", "endpoint_url", "region_name"})') from None


def _iterations(runs_root: str | Path, run: str | None = None) -> list[str]:
    found = sorted({int(ITER_DIR_RE.match(name).group(1)) for r, name in committed_artifacts(runs_root)
                    if run is None or r == run})
    return [str(i) for i in found]


def require_iteration(iteration: Any, runs_root: str | Path) -> int:
    """config ``iter``: set (the iteration-scoped targets act on one), listing the committed ones."""
    if iteration is None:
        have = _iterations(runs_root)
        listed = f" (committed under {runs_root}: {_listed(have)})" if have else ""
        raise UsageError(f"config iter is not set: this target acts on one iteration{listed}",
                         remedy=f"pass --config iter={have[-1] if have else 300}")
    return parse_iteration(iteration)


def runs_holding(runs_root: str | Path, iteration: int) -> list[tuple[str, str]]:
    """``(run, iter_dir_name)`` of every run under ``runs_root`` holding a committed ``iter_<iteration>``.

    The run is the path of the directory holding ``checkpoint_artifacts``, relative to ``runs_root``.
    """
    return [(run, name) for run, name in committed_artifacts(runs_root)
            if int(ITER_DIR_RE.match(name).group(1)) == iteration]


def resolve_run(runs_root: str | Path, iteration: int, run: str | None) -> tuple[str, str]:
    """``(run, iter_dir_name)`` the iteration-scoped targets act on.

    ``run`` given: it, with its existing directory for ``iteration`` (any zero padding) or ``iter_NNNNNN``.
    Omitted: the one run holding a committed ``iter_<iteration>``; none or several is a ``UsageError``
    that lists the candidates.
    """
    if run:
        run = run.strip("/")
        artifacts = Path(runs_root) / run / ARTIFACTS_DIR
        names = sorted(n for n in (os.listdir(artifacts) if artifacts.is_dir() else [])
                       if (m := ITER_DIR_RE.match(n)) and int(m.group(1)) == iteration)
        if len(names) > 1:
            raise UsageError(f"{artifacts} holds several directories of iteration {iteration}: {names}",
                             remedy="keep one of them (move the others out of checkpoint_artifacts/)")
        return run, names[0] if names else iteration_name(iteration)
    candidates = runs_holding(runs_root, iteration)
    if len(candidates) == 1:
        return candidates[0]
    listed = "; ".join(f"{r} ({n})" for r, n in candidates)
    if not candidates:
        have = _iterations(runs_root)
        committed = f" (committed iterations: {_listed(have)})" if have else ""
        raise UsageError(f"no run under {runs_root} holds a committed {ARTIFACTS_DIR}/iter_{iteration}{committed}",
                         remedy=f"pass --config iter=N for a committed iteration, or {RUN_REMEDY.removeprefix('pass ')}")
    raise UsageError(f"several runs under {runs_root} hold a committed {ARTIFACTS_DIR}/iter_{iteration}: {listed}",
                     remedy=RUN_REMEDY)


def resolve_target(runs_root: str | Path, iteration: int, run: str | None, *, may_be_new: bool) -> tuple[str, str]:
    """``resolve_run``, refusing a configured run or iteration that is not on disk unless the target may
    create or fetch it (``may_be_new``: a merge recipe writes it, or the bucket holds its archive); the
    remedy lists the runs holding the iteration, or the iterations the run holds."""
    found = resolve_run(runs_root, iteration, run)
    if not run or may_be_new:
        return found
    run_dir = Path(runs_root) / found[0]
    if not (run_dir / ARTIFACTS_DIR).is_dir():
        holding = [r for r, _ in runs_holding(runs_root, iteration)]
        runs = holding or sorted(find_runs(runs_root))
        what = f"runs holding iter_{iteration}" if holding else "runs"
        listed = f" ({what}: {_listed(runs)})" if runs else ""
        raise UsageError(f"config run {found[0]} is not a run under {runs_root}{listed}",
                         remedy=f"pass --config run={runs[0] if runs else '<project>/<group>/<run>/<ts>'}")
    if found[1] not in {n for r, n in committed_artifacts(runs_root) if r == found[0]}:
        have = _iterations(runs_root, found[0])
        listed = f" (committed: {_listed(have)})" if have else ""
        raise UsageError(f"config run {found[0]} holds no committed {ARTIFACTS_DIR}/iter_{iteration}{listed}",
                         remedy=f"pass --config iter={have[-1]}" if have else RUN_REMEDY)
    return found
