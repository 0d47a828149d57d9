"""Errors that name the real problem and exit codes scripts can trust: a mistyped path is said not to
exist, prune-verified fails when a requested artifact cannot be released, seal confirms what it already
sealed, resume-check creates nothing, retries against an unreachable endpoint are announced, and
``-v`` works after the verb. Every case runs the real CLI in a subprocess, piped (JSON on stdout)."""

from __future__ import annotations

import socket

import pytest

from ckptflow.jsonio import validate
from ckptflow.records import manifest as manifest_record
from helpers.cli import finish, run_cli, start_cli
from helpers.trees import tree_bytes

PREFIX = "proj/group/run1/20261129T000000Z/checkpoints"


@pytest.fixture
def env(tmp_path):
    return {"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}


def _artifact(root, it: int, size: int = 1000):
    art = root / "checkpoint_artifacts" / f"iter_{it:06d}"
    art.mkdir(parents=True)
    (art / "model.pt").write_bytes(bytes([it % 256]) * size)
    return art


def _seal_and_publish(art, archive, env):
    it = int(art.name.split("_")[1])
    assert run_cli("seal", "--artifact-dir", str(art), "--iteration", str(it), "model=model.pt", env=env).returncode == 0
    proc = run_cli("publish", "--artifact-dir", str(art), "--upload-prefix", PREFIX, "--bucket", f"file://{archive}",
                   env=env)
    assert proc.returncode == 0, proc.stderr


@pytest.fixture
def archive(tmp_path, env):
    archive = tmp_path / "archive"
    archive.mkdir()
    proc = run_cli("probe", "--bucket", f"file://{archive}", "--prefix", PREFIX, env=env)
    assert proc.returncode == 0, proc.stderr
    return archive


@pytest.mark.parametrize("verb", ["verify", "prune-verified", "resume-check", "retain-checkpoints", "status"])
def test_a_path_that_does_not_exist_is_named_not_taken_for_a_fresh_or_unpublished_one(tmp_path, env, verb):
    typo = tmp_path / "runs" / "proj" / "grp" / "run1" / "2026120T000000Z"
    art = typo / "checkpoint_artifacts" / "iter_000007"
    args = {"verify": ("--artifact-dir", str(art)), "prune-verified": ("--paths", str(art)),
            "resume-check": ("--attempt-dir", str(typo)), "retain-checkpoints": ("--run-dir", str(typo), "--keep-last", "1"),
            "status": (str(typo),)}[verb]
    before = tree_bytes(tmp_path)
    proc = run_cli(verb, *args, env=env)
    assert proc.returncode == 1, proc.stdout
    line = proc.stderr
    assert line.count("\n") == 1 and line.startswith(f"ckptflow {verb}: ") and "does not exist" in line, line
    assert (str(art) if verb in ("verify", "prune-verified") else str(typo)) in line
    assert "run `ckptflow publish`" not in line and "fresh attempt" not in line and "Traceback" not in line
    assert tree_bytes(tmp_path) == before and not typo.exists()


@pytest.mark.slow
def test_prune_verified_fails_when_a_requested_path_is_missing_or_no_longer_matches(tmp_path, archive, env):
    runs = tmp_path / "run"
    a, b, c = (_artifact(runs, it) for it in (1, 2, 3))
    for art in (a, b, c):
        _seal_and_publish(art, archive, env)
    missing = runs / "checkpoint_artifacts" / "iter_000009"
    remote_b = archive / PREFIX.rsplit("/", 1)[0] / "checkpoint_artifacts" / b.name / "model.pt"
    remote_b.write_bytes(b"z" * 1000)  # the archive no longer matches b's receipt

    # several arguments (as a shell glob expands them) and the comma form together
    proc = run_cli("prune-verified", "--paths", str(a), str(missing), f"{b},{c}", env=env)
    assert proc.returncode == 1, proc.stderr
    report = proc.report
    validate(report, "report_prune_verified", what="prune-verified report")
    assert report["status"] == "failed"
    assert [r["path"] for r in report["removed"]] == [str(a), str(c)]  # what went is still listed
    kept = {k["path"]: k for k in report["kept"]}
    assert set(kept) == {str(missing), str(b)} and all(k["error"] for k in kept.values())
    assert "does not exist" in kept[str(missing)]["reason"]
    assert not (a / "model.pt").exists() and not (c / "model.pt").exists() and (b / "model.pt").exists()
    assert proc.stderr.count("\n") == 1 and str(missing) in proc.stderr and str(b) in proc.stderr

    again = run_cli("prune-verified", "--paths", str(a), str(c), env=env)  # already released: nothing wrong
    assert again.returncode == 0 and again.report["status"] == "done", again.stderr


def test_seal_of_an_already_sealed_directory_with_the_same_bytes_is_already_sealed(tmp_path, env):
    art = _artifact(tmp_path / "run", 7)
    args = ("seal", "--artifact-dir", str(art), "--iteration", "7", "model=model.pt")
    assert run_cli(*args, env=env).report["status"] == "sealed"
    manifest = manifest_record.path_in(art).read_bytes()
    again = run_cli(*args, env=env)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert again.report["status"] == "already-sealed" and again.report["files"] == 1
    validate(again.report, "report_seal", what="seal report")

    (art / "model.pt").write_bytes(b"other" * 200)  # same size, other bytes: refused, manifest untouched
    changed = run_cli(*args, env=env)
    assert changed.returncode == 1 and changed.report["status"] == "refused"
    assert "already exists" in changed.stderr and "['model']" in changed.stderr
    assert manifest_record.path_in(art).read_bytes() == manifest


def test_resume_check_off_names_the_fresh_attempt_and_creates_nothing(tmp_path, env):
    run = tmp_path / "runs" / "run1"
    attempt = run / "20261129T000000Z"
    (attempt / "checkpoints").mkdir(parents=True)
    (attempt / "notes.txt").write_text("not empty")
    before = tree_bytes(tmp_path)
    first = run_cli("resume-check", "--attempt-dir", str(attempt), "--resume", "off", env=env)
    second = run_cli("resume-check", "--attempt-dir", str(attempt), "--resume", "off", env=env)
    assert first.returncode == second.returncode == 0, first.stderr
    validate(first.report, "report_resume_check", what="resume-check report")
    minted = first.report["attempt_dir"]
    assert minted != str(attempt) and minted.startswith(f"{attempt}-fresh-") and not (run / minted).exists()
    assert tree_bytes(tmp_path) == before and sorted(p.name for p in run.iterdir()) == [attempt.name]

    from ckptflow.trainer.resume import pin_run_attempt  # the trainer is the one that creates it

    pinned = pin_run_attempt(attempt, "off")
    assert pinned.attempt_dir.startswith(f"{attempt}-fresh-") and (run / pinned.attempt_dir).is_dir()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_retries_against_an_unreachable_endpoint_are_announced_while_they_run(tmp_path, env):
    creds = tmp_path / "creds.json"
    creds.write_text('{"aws_access_key_id": "k", "aws_secret_access_key": "s", '
                     f'"endpoint_url": "http://127.0.0.1:{_closed_port()}"}}')
    proc = start_cli("probe", "--bucket", "s3://bkt", "--prefix", PREFIX, "--credentials", str(creds), env=env)
    try:
        first = proc.stderr.readline()  # blocks until the first line: it must come while retries remain
        running = proc.poll() is None
    finally:
        _out, err = finish(proc)
    # The line names the operation being retried: a probe's first request is the bucket's existence check.
    assert "retrying up to 7 more times" in first and "HeadBucket" in first and "s3://bkt at 127.0.0.1:" in first
    assert "at most" in first and "EndpointConnectionError" in first
    assert running, "the retry line came only after the command had given up"
    assert proc.returncode == 1 and "cannot reach the endpoint" in err


@pytest.mark.parametrize("where", ["before", "after"])
def test_verbose_is_accepted_before_and_after_the_verb(tmp_path, archive, env, where):
    art = _artifact(tmp_path / "run", 4)
    _seal_and_publish(art, archive, env)
    args = ("verify", "--artifact-dir", str(art))
    proc = run_cli("-v", *args, env=env) if where == "before" else run_cli(*args, "--verbose", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "ckptflow: INFO: " in proc.stderr, proc.stderr


@pytest.mark.parametrize("verb", ["merge", "fetch", "materialize"])
@pytest.mark.parametrize("value", ["inf", "nan", "-1", "soon"])
def test_every_verb_that_takes_a_lock_refuses_a_wait_that_is_not_finite_seconds(verb, value):
    proc = run_cli(verb, "--lock-wait-seconds", value)
    assert proc.returncode == 2, proc.stderr
    assert f"--lock-wait-seconds: {value!r} is not a finite number of seconds >= 0" in proc.stderr


# Each verb's required arguments, so that the unknown flag is the only error its parser finds.
_REQUIRED = {
    "seal": ("--artifact-dir", "A", "--iteration", "1", "model=model.pt"),
    "merge": ("--mode", "avg", "--experts", "a,b", "--out", "o/iter_000001/model.pt"),
    "publish": ("--artifact-dir", "A"), "verify": ("--artifact-dir", "A"), "prune-verified": ("--paths", "A"),
    "restore": ("--artifact-dir", "A"), "fetch": ("--artifact-uri", "s3://b/p/iter_1", "--dst", "D"),
    "materialize": ("--ckpt-dir", "A", "--base", "B", "--out", "O"), "probe": ("--prefix", "p"),
    "status": ("R",), "ls": ("s3://b/p",), "resume-check": ("--attempt-dir", "A"),
    "retain-checkpoints": ("--run-dir", "R", "--keep-last", "1"), "gc-uploads": ("--prefix", "p/"),
    "repair-part-digests": ("--artifact-dir", "A"),
}


@pytest.mark.parametrize("verb", list(_REQUIRED))
def test_an_unknown_flag_after_a_verb_is_named_by_the_verb_with_its_usage(tmp_path, verb):
    from ckptflow.cli import VERBS

    assert sorted(_REQUIRED) == sorted(VERBS)  # every verb is covered
    before = tree_bytes(tmp_path)
    proc = run_cli(verb, *_REQUIRED[verb], "--no-such-flag", env={"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr
    assert f"usage: ckptflow {verb} " in proc.stderr, proc.stderr
    assert f"ckptflow {verb}: error: unrecognized arguments: --no-such-flag\n" in proc.stderr, proc.stderr
    assert "ckptflow: error:" not in proc.stderr and "{seal,merge" not in proc.stderr, proc.stderr
    assert proc.report == {"status": "usage-error", "credentials": None,
                           "error": {"type": "UsageError", "message": "unrecognized arguments: --no-such-flag"}}
    assert tree_bytes(tmp_path) == before


def test_an_unknown_flag_before_the_verb_is_the_top_level_parser_s():
    proc = run_cli("--no-such-flag", "status", "R")
    assert proc.returncode == 2 and "ckptflow: error: unrecognized arguments: --no-such-flag" in proc.stderr, proc.stderr


def test_prune_of_an_artifact_holding_an_unsealed_file_says_move_it_out_first(tmp_path, archive, env):
    art = _artifact(tmp_path / "run", 5)
    _seal_and_publish(art, archive, env)
    (art / "train.log").write_text("step 1 loss 2.3\n")  # written beside the checkpoint after it was sealed
    before = tree_bytes(art)
    proc = run_cli("prune-verified", "--paths", str(art), env=env)
    [kept] = proc.report["kept"]
    reason = kept["reason"]
    assert "['train.log']" in reason and "move them out of the artifact directory" in reason, reason
    # The remedy that fits a log comes first; a new artifact is for files that belong to the checkpoint.
    assert reason.index("move them out of the artifact directory") < reason.index("new artifact"), reason
    assert proc.report["removed"] == [] and tree_bytes(art) == before
    (art / "train.log").rename(tmp_path / "train.log")  # doing what it says frees the artifact
    again = run_cli("prune-verified", "--paths", str(art), env=env)
    assert again.returncode == 0 and again.report["kept"] == [] and not (art / "model.pt").exists(), again.stderr


def test_a_prune_refusal_names_the_path_once(tmp_path, env):
    art = tmp_path / "run" / "checkpoint_artifacts" / "iter_000007"
    proc = run_cli("prune-verified", "--paths", str(art), env=env)
    assert proc.returncode == 1, proc.stdout
    assert proc.stderr.count(str(art)) == 1 and "does not exist" in proc.stderr, proc.stderr
