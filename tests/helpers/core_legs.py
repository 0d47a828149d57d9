"""The core legs of ``make test``: the torch-free core on the other Python versions present.

For each version (3.10, 3.12, 3.13 by default) this creates a throw-away virtual environment under
``.ckptflow/core-legs/py<X.Y>`` holding only the core install (``pip install -e .``, no extra) plus pytest
and moto, at the lock's versions of those packages (the lines of ``constraints.txt`` naming them; the
lock's other pins are for 3.11 and some have no wheel elsewhere). It checks that torch, transformers and
snakemake are absent from it, then runs ``CORE_TESTS`` there against the already-running test servers
(``CKPTFLOW_TEST_SERVERS``): records, stores on SeaweedFS, seal/probe/publish/verify/prune/fetch and the
CLI, so a core-only install publishes and fetches without torch present. An environment is reused while
pyproject.toml and constraints.txt are unchanged (pip's own cache keeps reinstalls fast).

The legs run at the same time (``--jobs``, default all of them): each one's output goes to
``.ckptflow/core-legs/py<X.Y>.log`` and is printed, whole, only when the leg fails; one line per leg says
how it ended. They share the servers with each other and with the 3.11 suite, which the tests allow: every
test has its own bucket and every pytest process its own cache (tests/conftest.py).

An interpreter is looked up as ``$(pyenv root)/versions/X.Y.*/bin/pythonX.Y``, then ``pythonX.Y`` on PATH.
A missing one skips its leg with a message, except when ``CI`` is set: then it fails.

``--prepare`` only creates the environments, one after another (no servers needed; any Python 3.11 runs
it): ``make test`` does that while its own setup installs the development environment, on the core that
setup's pip leaves idle, so that the legs later only run their tests.

    python tests/helpers/core_legs.py [--versions 3.10 3.12] [--jobs N] [--servers DIR] [-- PYTEST_ARGS...]
    python tests/helpers/core_legs.py --prepare [--versions ...]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / ".ckptflow" / "core-legs"
VERSIONS = ("3.10", "3.12", "3.13")
# Test files that import nothing of the [convert] or [workflow] extras (at module level or through their
# conftest and helpers). Slow tests are deselected: the 3.11 suite runs them.
CORE_TESTS = (
    "tests/records", "tests/store/test_s3.py", "tests/store/test_local.py", "tests/store/test_uri.py",
    "tests/store/test_open.py", "tests/store/test_credentials.py", "tests/store/test_gcs_sign.py",
    "tests/archive/test_publish.py", "tests/archive/test_fetch.py", "tests/archive/test_verify_prune.py",
    "tests/archive/test_probe.py", "tests/test_cli.py", "tests/test_install.py", "tests/test_digest.py",
    "tests/test_fsutil.py", "tests/test_trainer.py",
)
TEST_TOOLS = ("pytest", "moto", "boto3")  # boto3: the tests' own S3 clients (the core uses botocore alone)
HEAVY = ("torch", "transformers", "snakemake")


def log(message: str) -> None:
    sys.stderr.write(f"core legs: {message}\n")
    sys.stderr.flush()


def _pyenv_root() -> Path | None:
    if os.environ.get("PYENV_ROOT"):
        return Path(os.environ["PYENV_ROOT"])
    if shutil.which("pyenv"):
        out = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False).stdout.strip()
        if out:
            return Path(out)
    home = Path.home() / ".pyenv"
    return home if home.is_dir() else None


def _reports_version(python: str, version: str) -> bool:
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    try:
        out = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return False
    return out.returncode == 0 and out.stdout.strip() == version


def find_interpreter(version: str) -> str | None:
    """A working ``pythonX.Y`` (pyenv's shims refuse a version that is not selected: use the real binary)."""
    candidates = []
    root = _pyenv_root()
    if root is not None:
        found = sorted((root / "versions").glob(f"{version}.*/bin/python{version}"))
        candidates += [str(p) for p in reversed(found)]
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(on_path)
    return next((c for c in candidates if _reports_version(c, version)), None)


def core_constraints() -> str:
    """The lock's pins of the core's dependencies and the test tools, one per line."""
    import tomllib  # this script runs on the 3.11 development environment, not in the legs

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    names |= set(TEST_TOOLS)
    lines = (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines()
    keep = [ln for ln in lines if "==" in ln and ln.split("==")[0].strip().lower() in names]
    missing = names - {ln.split("==")[0].strip().lower() for ln in keep}
    if missing:
        raise SystemExit(f"core legs: constraints.txt pins none of {sorted(missing)}; add them (pip freeze)")
    return "\n".join(keep) + "\n"


def _stamp(version: str, constraints: str) -> str:
    digest = hashlib.sha256((REPO / "pyproject.toml").read_bytes() + constraints.encode() + version.encode())
    return digest.hexdigest()


def prepare(version: str, python: str, out) -> Path:
    """The leg's environment, created (or recreated when the project's requirements changed)."""
    venv = ROOT / f"py{version}"
    constraints = core_constraints()
    stamp_file = venv / ".ckptflow-core-leg"
    stamp = _stamp(version, constraints)
    if stamp_file.is_file() and stamp_file.read_text() == stamp and (venv / "bin" / "python").exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    # No pip of its own (ensurepip costs seconds of CPU per leg): the interpreter's pip installs into it
    # (``pip --python``), without compiling every module up front (the tests import a fraction of moto).
    subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, stdout=out,
                   stderr=subprocess.STDOUT)
    pins = ROOT / f"constraints-core-{version}.txt"
    pins.write_text(constraints, encoding="utf-8")
    started = time.monotonic()
    subprocess.run([python, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet",
                    "--disable-pip-version-check", "--no-compile", "-c", str(pins), "-e", str(REPO), "pytest",
                    "moto[s3]"], check=True, stdout=out, stderr=subprocess.STDOUT)
    log(f"{version}: installed the core in {venv} in {time.monotonic() - started:.0f} s")
    stamp_file.write_text(stamp)
    return venv


def check_no_heavy(venv: Path, version: str) -> None:
    code = f"import importlib.util as u; print(' '.join(m for m in {HEAVY!r} if u.find_spec(m)))"
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    if out.stdout.strip():
        raise SystemExit(f"core legs: {version}: {out.stdout.strip()} installed in the core-only {venv}; "
                         "the core must not depend on them (check pyproject.toml's dependencies)")


def run_leg(version: str, python: str, servers: Path, pytest_args: list[str]) -> int:
    """One leg, its whole output in its log; the log is printed when the leg fails."""
    ROOT.mkdir(parents=True, exist_ok=True)
    log_path = ROOT / f"py{version}.log"
    started = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as out:
        try:
            venv = prepare(version, python, out)
            check_no_heavy(venv, version)
        except (subprocess.CalledProcessError, SystemExit) as exc:
            out.write(f"{exc}\n")
            rc = 1
        else:
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
            env["CKPTFLOW_TEST_SERVERS"] = str(servers)
            cmd = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow",
                   *pytest_args, *CORE_TESTS]
            out.flush()
            rc = subprocess.run(cmd, cwd=REPO, env=env, check=False, stdout=out, stderr=subprocess.STDOUT).returncode
    text = log_path.read_text(encoding="utf-8", errors="replace")
    summary = text.strip().splitlines()[-1] if text.strip() else "no output"
    if rc != 0:
        sys.stderr.write(f"---- core leg {version}: {log_path}\n{text}---- end of core leg {version}\n")
    log(f"{version}: {'passed' if rc == 0 else f'FAILED (exit {rc})'} in {time.monotonic() - started:.0f} s "
        f"({summary}; log {log_path.relative_to(REPO)})")
    return rc


def prepare_all(found: dict[str, str]) -> int:
    """``--prepare``: each leg's environment, one after another; a failure is told here and again, in its
    leg's log, when the leg runs (and prepares it again)."""
    ROOT.mkdir(parents=True, exist_ok=True)
    failed = []
    for version, python in found.items():
        with open(ROOT / f"prepare-py{version}.log", "w", encoding="utf-8") as out:
            try:
                prepare(version, python, out)
            except (subprocess.CalledProcessError, SystemExit) as exc:
                log(f"{version}: preparing its environment failed: {exc}")
                failed.append(version)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--versions", nargs="+", default=list(VERSIONS))
    p.add_argument("--jobs", type=int, default=0, help="legs at the same time (default: all)")
    p.add_argument("--servers", type=Path, default=Path(os.environ.get("CKPTFLOW_TEST_SERVERS")
                                                         or REPO / ".ckptflow" / "test-servers"))
    p.add_argument("--prepare", action="store_true", help="only create the environments, one after another")
    p.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = p.parse_args(argv)
    ci = bool(os.environ.get("CI"))
    failed, skipped = [], []
    found: dict[str, str] = {}
    for version in args.versions:
        python = find_interpreter(version)
        if python is None:
            if ci:
                log(f"{version}: no Python {version} found (pyenv or python{version} on PATH), and CI is set")
                failed.append(version)
            else:
                log(f"{version}: skipped: no Python {version} found (pyenv or python{version} on PATH)")
                skipped.append(version)
            continue
        log(f"{version}: {python}")
        found[version] = python
    if args.prepare:
        return prepare_all(found)
    ran = list(found)
    servers = args.servers.resolve()
    with ThreadPoolExecutor(max_workers=args.jobs or max(1, len(found))) as pool:
        futures = {v: pool.submit(run_leg, v, python, servers, args.pytest_args) for v, python in found.items()}
    failed += [v for v in ran if futures[v].result() != 0]
    log(f"ran {', '.join(ran) or 'none'}; skipped {', '.join(skipped) or 'none'}; failed {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
