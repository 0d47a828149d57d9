"""The CLI's face for people: on a terminal every verb prints a short summary (what, how many files and
bytes, where, how long; a refusal as its one line); on a pipe, or with ``--json``, the JSON report exactly
as before. Each verb is driven for real with stdout on a pseudo-terminal."""

from __future__ import annotations

import json
import re

import pytest

from ckptflow import cli
from ckptflow.commands import seal as seal_command
from ckptflow.commands import summary
from ckptflow.jsonio import validate
from helpers.cli import run_cli, run_on_terminal

PREFIX = "proj/group/run1/20261129T000000Z"
MODEL_BYTES = 3 * 2**20


@pytest.fixture
def env(tmp_path):
    return {"CKPTFLOW_CACHE_DIR": str(tmp_path / "cache")}


@pytest.fixture
def artifact(tmp_path):
    """An unsealed iter_000007 holding exactly the files seal will name: model.pt (3 MiB) and optim/."""
    art = tmp_path / "run" / "checkpoint_artifacts" / "iter_000007"
    (art / "optim").mkdir(parents=True)
    (art / "model.pt").write_bytes(b"m" * MODEL_BYTES)
    (art / "optim" / ".metadata").write_bytes(b"x")
    (art / "optim" / "__0_0.distcp").write_bytes(b"y" * 10)
    return art


def _summary(proc, *needles: str) -> str:
    """A summary on the terminal: no JSON, every needle, and how long it took on the last line."""
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert not out.lstrip().startswith("{") and '"status":' not in out, out
    for needle in needles:
        assert needle in out, f"{needle!r} not in\n{out}"
    assert re.search(r"\n  took +[0-9.]+ s\n\Z", out), out
    return out


def _same_json(*args: str, env: dict, code: int = 0) -> dict:
    """``--json`` on a terminal, after the verb or before it, prints byte for byte what a pipe gets."""
    piped = run_cli(*args, env=env)
    after = run_on_terminal(*args, "--json", env=env)
    before = run_on_terminal("--json", *args, env=env)
    assert piped.returncode == after.returncode == before.returncode == code, (piped.stderr, after.stderr)
    assert after.stdout == piped.stdout == before.stdout
    assert after.stderr == piped.stderr == before.stderr
    return piped.report


def _seal(artifact, env):
    return run_on_terminal("seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt", "optim=optim",
                           env=env)


def _publish_args(artifact, archive):
    return ("publish", "--artifact-dir", str(artifact), "--upload-prefix", f"{PREFIX}/checkpoints",
            "--bucket", f"file://{archive}")


@pytest.mark.slow
def test_seal_publish_verify_prune_fetch_probe_read_as_summaries_on_a_terminal(artifact, tmp_path, env):
    archive = tmp_path / "archive"
    archive.mkdir()
    where = f"file://{archive}/{PREFIX}/checkpoint_artifacts/iter_000007"

    _summary(_seal(artifact, env), "sealed iteration 7: 2 components (model, optim), 3 payload files, 3.00 MiB",
             f"artifact  {artifact}\n")
    refused = _same_json("seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt", env=env, code=1)
    validate(refused, "report_error", what="error report")

    probe = ("probe", "--bucket", f"file://{archive}", "--prefix", f"{PREFIX}/checkpoints")
    _summary(run_on_terminal(*probe, env=env), f"passed: file://{archive} enforces create-once",
             "race         1 of 8 creators won")
    validate(_same_json(*probe, env=env), "report_probe", what="probe report")

    _summary(run_on_terminal(*_publish_args(artifact, archive), env=env), "published 3 payload files, 3.00 MiB as 6 objects (with 3 records)",
             f"archive   {where}\n", "uploaded  3 payload files, 3.00 MiB\n")
    again = _same_json(*_publish_args(artifact, archive), env=env)
    assert again["status"] == "skipped"

    verify = ("verify", "--artifact-dir", str(artifact))
    _summary(run_on_terminal(*verify, env=env), "verified 6 objects (3 payload files, 3 records) of the archive (contents read and hashed)",
             f"archive   {where}\n")
    validate(_same_json(*verify, env=env), "report_verify", what="verify report")

    prune = ("prune-verified", "--paths", str(artifact), "--dry-run")
    _summary(run_on_terminal(*prune, env=env),
             "dry run: would free 3.00 MiB (3 payload files of 1 artifact), 0 artifacts kept; nothing was deleted",
             f"would remove  {artifact} (3 payload files, 3.00 MiB)\n")
    assert _same_json(*prune, env=env)["removed"][0]["bytes"] == MODEL_BYTES + 11
    assert (artifact / "model.pt").stat().st_size == MODEL_BYTES

    fetch = ("fetch", "--artifact-uri", where, "--dst", str(tmp_path / "stage"))
    _summary(run_on_terminal(*fetch, env=env), "fetched iteration 7: 3 payload files, 3.00 MiB + 1 record", f"from        {where}\n",
             f"to          {tmp_path / 'stage' / 'iter_000007'}\n", "downloaded  3 payload files, 3.00 MiB\n")
    assert _same_json(*fetch, env=env)["status"] == "already-staged"


@pytest.mark.slow
def test_a_failed_verify_lists_what_failed_and_keeps_its_stderr_line(artifact, tmp_path, env):
    archive = tmp_path / "archive"
    archive.mkdir()
    assert _seal(artifact, env).returncode == 0
    assert run_cli(*_publish_args(artifact, archive), env=env).returncode == 0
    (archive / PREFIX / "checkpoint_artifacts" / "iter_000007" / "model.pt").unlink()

    verify = ("verify", "--artifact-dir", str(artifact))
    shown = run_on_terminal(*verify, env=env)
    piped = _same_json(*verify, env=env, code=1)
    assert shown.returncode == 1
    assert shown.stderr == run_cli(*verify, env=env).stderr and shown.stderr.count("\n") == 1
    assert shown.stdout.startswith("failed: 1 of 6 objects not ok"), shown.stdout
    assert re.search(r"^  missing +model\.pt", shown.stdout, re.M), shown.stdout
    assert piped["status"] == "failed"


def test_a_refusal_on_a_terminal_is_its_one_line(artifact, env):
    args = ("seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt")
    assert run_on_terminal(*args, "optim=optim", env=env).returncode == 0  # sealed with other components
    piped = run_cli(*args, env=env)
    shown = run_on_terminal(*args, env=env)
    assert shown.returncode == piped.returncode == 1
    assert shown.stderr == piped.stderr  # the stderr line is unchanged
    line = piped.stderr
    assert line.count("\n") == 1 and line.startswith("ckptflow seal: refused: ") and "seal into a new" in line
    assert shown.stdout == line  # stderr is a pipe here: the terminal gets the same one line

    both = run_on_terminal(*args, env=env, stderr_terminal=True)  # one terminal for both: the line once
    assert both.returncode == 1 and both.stdout == line


def test_a_usage_error_on_a_terminal_is_its_one_line(artifact, env):
    args = ("seal", "--artifact-dir", str(artifact), "--iteration", "7", "not-a-spec")
    shown = run_on_terminal(*args, env=env)
    assert shown.returncode == 2
    assert shown.stdout == shown.stderr and shown.stderr.startswith("ckptflow seal: usage error: ")
    assert _same_json(*args, env=env, code=2)["status"] == "usage-error"


@pytest.mark.slow  # torch in every subprocess
def test_merge_and_materialize_read_as_summaries_on_a_terminal(tmp_path, env):
    from helpers import tiny_models as tm

    base = tm.build_tiny_base("qwen3", tmp_path / "base")
    sd = tm.in_memory_state_dict(base)
    experts = []
    for i in range(2):
        (tmp_path / f"e{i}").mkdir()
        experts.append(str(tm.save_consolidated(tm.perturbed(sd, 0.01, seed=i), tmp_path / f"e{i}" / "model.pt")))
    out = tmp_path / "run" / "checkpoint_artifacts" / "iter_000300" / "model.pt"
    merge = ("merge", "--mode", "avg", "--experts", ",".join(experts), "--out", str(out))
    shown = _summary(run_on_terminal(*merge, env=env), "merged 2 experts by average into iteration 300: ",
                     f"out     {out}\n", "why     no previous output\n")
    model_size = out.stat().st_size
    assert f"model.pt {summary.human_bytes(model_size)}" in shown.splitlines()[0]
    again = run_on_terminal(*merge, "--json", env=env)  # the pipe's JSON is covered above; torch makes runs slow
    assert again.returncode == 0 and json.loads(again.stdout)["status"] == "skipped"

    teacher = tmp_path / "teacher"
    materialize = ("materialize", "--ckpt-dir", str(out.parent), "--base", str(base), "--out", str(teacher),
                   "--min-tensors", "1")
    _summary(run_on_terminal(*materialize, env=env), "built the Hugging Face model: ", f"out       {teacher}\n",
             f"from      {out.parent} (model.pt {summary.human_bytes(model_size)})\n", "checks passed, ")
    again = run_on_terminal(*materialize, "--json", env=env)
    assert again.returncode == 0 and again.stdout.count("\n") == 1
    report = json.loads(again.stdout)
    assert report["status"] == "skipped"
    validate(report, "report_materialize", what="materialize report")


def test_units_are_human():
    sizes = (0, 1023, 1024, 1536, 10 * 2**20 - 1, 100 * 2**20 - 1, 2**30 - 1, 3 * 2**30, 2**50 * 5000)
    assert [summary.human_bytes(n) for n in sizes] == [
        "0 B", "1023 B", "1.00 KiB", "1.50 KiB", "10.0 MiB", "100 MiB", "1.00 GiB", "3.00 GiB", "5000 PiB"]
    assert [summary.human_duration(s) for s in (0.123, 42.04, 123, 3725)] == [
        "0.12 s", "42.0 s", "2 min 03 s", "1 h 02 min"]
    s3 = {"scheme": "s3", "endpoint": "127.0.0.1:18333", "bucket": "b", "prefix": "p/iter_1"}
    assert summary.destination_uri(s3) == "s3://b/p/iter_1 at 127.0.0.1:18333"
    assert summary.destination_uri({"scheme": "file", "endpoint": "/arch/", "bucket": ""}) == "file:///arch"


def test_a_verb_without_its_own_summary_gets_key_value_lines(monkeypatch):
    monkeypatch.delattr(seal_command, "summarize")
    report = {"status": "sealed", "artifact_dir": "/a/iter_000007", "components": ["model"], "files": 1,
              "total_bytes": 5, "inventory": [{"path": "model.pt"}]}
    assert summary.render("seal", report, 1.5).splitlines() == [
        "sealed", "  artifact_dir  /a/iter_000007", "  components    model", "  files         1",
        "  inventory     1 entries", "  total_bytes   5", "  took          1.50 s"]


def test_a_summary_that_breaks_falls_back_without_changing_the_outcome(artifact, monkeypatch, capsys, caplog):
    def broken(report, elapsed):
        raise KeyError("iteration")

    monkeypatch.setattr(seal_command, "summarize", broken)
    monkeypatch.setattr(cli, "_is_terminal", lambda stream: True)
    assert cli.main(["seal", "--artifact-dir", str(artifact), "--iteration", "7", "model=model.pt"]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("sealed\n") and "  files         1\n" in captured.out
    assert "no summary for this report (KeyError" in caplog.text


def test_a_failed_verify_or_resume_check_on_one_terminal_says_it_once(artifact, tmp_path, env):
    archive = tmp_path / "archive"
    archive.mkdir()
    assert _seal(artifact, env).returncode == 0
    assert run_cli(*_publish_args(artifact, archive), env=env).returncode == 0
    (archive / PREFIX / "checkpoint_artifacts" / "iter_000007" / "model.pt").unlink()
    both = run_on_terminal("verify", "--artifact-dir", str(artifact), env=env, stderr_terminal=True)
    assert both.returncode == 1 and both.stdout.startswith("failed: 1 of 6 objects not ok"), both.stdout
    assert "ckptflow verify:" not in both.stdout and both.stdout.count("model.pt") == 1, both.stdout

    attempt = artifact.parent.parent  # holds the committed model-only artifact: a step-0 restart is refused
    both = run_on_terminal("resume-check", "--attempt-dir", str(attempt), env=env, stderr_terminal=True)
    assert both.returncode == 1 and both.stdout.startswith("refused: "), both.stdout
    assert both.stdout.count("step-0 restart") == 1 and both.stdout.count("remedy 1") == 1, both.stdout


def test_retain_and_prune_summaries_list_what_was_removed_before_what_was_kept(tmp_path, env):
    run = tmp_path / "ts"
    for it in (1, 2, 3):
        d = run / "checkpoints" / f"iter_{it:07d}"
        d.mkdir(parents=True)
        (d / "model.pt").write_bytes(b"m" * 2048)
        (d / "trainer.pt").write_bytes(b"t" * 10)
        (d / ".uploaded").write_text("uploaded to s3://old-tool\n")
    out = _summary(run_on_terminal("retain-checkpoints", "--run-dir", str(run), "--keep-last", "1", env=env),
                   "removed 2 checkpoints (4.07 KiB), kept 1")
    lines = out.splitlines()[1:]  # the rows after the headline
    removed = [i for i, line in enumerate(lines) if line.lstrip().startswith("removed ")]
    kept = [i for i, line in enumerate(lines) if line.lstrip().startswith("kept ")]
    assert len(removed) == 2 and len(kept) == 1 and max(removed) < min(kept), out
    assert f"{run / 'checkpoints' / 'iter_0000001'} (2.04 KiB)" in out
    assert f"kept     {run / 'checkpoints' / 'iter_0000003'}: one of the last 1" in out

    missing = tmp_path / "run" / "checkpoint_artifacts" / "iter_000001"
    shown = run_on_terminal("prune-verified", "--paths", str(missing), env=env)
    assert shown.returncode == 1 and shown.stdout.startswith("failed: nothing freed, 1 artifact kept"), shown.stdout
    assert f"kept  {missing} does not exist" in shown.stdout and shown.stdout.count(str(missing)) == 1, shown.stdout


# "3 payload files, 3.10 MiB", "5 objects, 3.10 MiB": a count named as what it counts, with its bytes.
_COUNTED = re.compile(r"(\d+) (payload files?|objects?|records?)\b(?:, (\d+(?:\.\d+)? (?:B|KiB|MiB|GiB)))?")
_SIZE = re.compile(r"\b\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)\b")


@pytest.mark.slow
def test_one_artifacts_life_reads_with_one_vocabulary_and_one_size_format_in_every_verb(tmp_path, env):
    """seal, publish --dry-run, publish, verify, prune-verified, restore, status and ls of one artifact on a
    terminal: its payload files, records and objects are named as such and agree across the verbs, every
    size is the one format, the run heading fits 80 columns, and status says nothing of the workflow."""
    run = "proj/group/" + "a-run-whose-name-is-long-enough-to-need-shortening-on-eighty-columns" + "/20261129T000000Z"
    root, archive = tmp_path / "runs", tmp_path / "archive"
    art = root / run / "checkpoint_artifacts" / "iter_000007"
    (art / "optim").mkdir(parents=True)
    (art / "model.pt").write_bytes(b"m" * (3 * 2**20 + 50_000))  # 3.05 MiB alone, 3.10 MiB with the shards
    (art / "optim" / ".metadata").write_bytes(b"x")
    (art / "optim" / "__0_0.distcp").write_bytes(b"y" * 50_000)  # 48.8 KiB
    archive.mkdir()
    payload_bytes = 3 * 2**20 + 100_001
    payload = f"3 payload files, {summary.human_bytes(payload_bytes)}"
    assert payload == "3 payload files, 3.10 MiB"
    bucket = ("--bucket", f"file://{archive}")

    def shown(*args: str) -> str:
        proc = run_on_terminal(*args, env=env, columns=80)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    said = {
        "seal": shown("seal", "--artifact-dir", str(art), "--iteration", "7", "model=model.pt", "optim=optim"),
        "plan": shown("publish", "--artifact-dir", str(art), *bucket, "--dry-run"),
        "publish": shown("publish", "--artifact-dir", str(art), *bucket),
        "verify": shown("verify", "--artifact-dir", str(art)),
        "prune plan": shown("prune-verified", "--paths", str(art), "--dry-run"),
        "prune": shown("prune-verified", "--paths", str(art)),
        "status pruned": shown("status", str(root)),
        "restore plan": shown("restore", "--artifact-dir", str(art), "--dry-run"),
        "restore": shown("restore", "--artifact-dir", str(art)),
        "status": shown("status", str(root)),
        "ls": shown("ls", f"file://{archive}", "--runs-root", str(root)),
    }
    first = {verb: text.splitlines()[0] for verb, text in said.items()}
    assert payload in first["seal"]
    assert f"would publish {payload} as 6 objects (with 3 records)" in first["plan"]
    assert f"published {payload} as 6 objects (with 3 records)" in first["publish"]
    assert f"  uploaded  {payload}\n" in said["publish"]
    assert "verified 6 objects (3 payload files, 3 records)" in first["verify"]
    assert "would free 3.10 MiB (3 payload files of 1 artifact)" in first["prune plan"]
    assert "freed 3.10 MiB (3 payload files of 1 artifact)" in first["prune"]
    assert f"({payload})" in said["prune"]
    assert f"would download {payload} (the artifact has {payload})" in first["restore plan"]
    assert f"restored {payload} (the artifact has {payload})" in first["restore"]
    assert "6 objects, 3.10 MiB" in first["ls"] and re.search(r"iter_000007 +committed +6 +3\.10 MiB ", said["ls"])
    assert "local 0 B, archived 3.10 MiB" in " ".join(said["status pruned"].split())
    assert "local 3.10 MiB, archived 3.10 MiB" in " ".join(said["status"].split())

    for verb, text in said.items():
        # every count of files names what it counts (no bare "files"), and its bytes are the artifact's
        assert not re.search(r"\d+ files?\b", text), f"{verb}: a bare count of files\n{text}"
        for n, noun, size in _COUNTED.findall(text):
            expected = {"payload file": ("3", "3.10 MiB"), "object": ("6", "3.10 MiB"), "record": ("3", None)}
            count, total = expected[noun.rstrip("s")]
            assert n in (count, "0", "1") or verb.startswith("prune"), f"{verb}: {n} {noun}\n{text}"
            assert not size or size in (total, "0 B"), f"{verb}: {n} {noun}, {size}\n{text}"
        # one rounding: three significant digits (3.10 MiB, 48.8 KiB), never the status table's old 3.1 MiB
        for size in _SIZE.findall(text):
            number, unit = size.split()
            assert unit == "B" or len(number.replace(".", "").lstrip("0")) == 3, f"{verb}: {size}\n{text}"
    # the tables (ls's headline is a sentence naming the archive's URI, left whole to be copied)
    table = [line for verb in ("status", "status pruned", "ls") for line in said[verb].split("\ndetails")[0].splitlines()
             if not line.startswith("1 artifact in 1 run under ")]
    assert all(len(line) <= 80 for line in table), "\n".join(line for line in table if len(line) > 80)
    headings = [line for line in table if line.startswith("proj/group/")]
    assert len(headings) == 3 and all("…" in line and line.endswith("/20261129T000000Z") for line in headings), table
    assert "not read" not in said["status"] and "--reports-dir" not in said["status"]


def test_the_credentials_row_is_aligned_with_the_summarys_other_rows():
    report = {"status": "restored", "artifact_dir": "/r/iter_000007", "source_uri": "s3://b/p at 127.0.0.1:1",
              "payloads": [{"path": "model.pt", "size": 5}], "total_bytes": 5, "missing": ["model.pt"],
              "missing_bytes": 5, "downloaded": ["model.pt"], "downloaded_bytes": 5, "resumed": [], "reused": [],
              "credentials": {"source": "file", "path": "/c/creds.json"}}
    lines = summary.render("restore", report, 1.5).splitlines()
    assert lines[1:] == [
        "  artifact     /r/iter_000007", "  from         s3://b/p at 127.0.0.1:1", "  downloaded   1 payload file, 5 B",
        "  credentials  file /c/creds.json", "  took         1.50 s"]
    assert summary.render("status", {**report, **_EMPTY_STATUS}, None).endswith("\n  credentials  file /c/creds.json")


_EMPTY_STATUS = {"root": "/runs", "rows": [], "reports_dir": None, "stage_dir": None, "teachers_dir": None}
