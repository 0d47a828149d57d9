"""The Hugging Face Trainer callback (``ckptflow.trainer.hf``) through ``examples/train_hf_trainer.py``: a tiny
Qwen3 trained for a few steps on CPU in real processes, alone and under ``torchrun --nproc-per-node 2``
(gloo), publishing to a file:// archive."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ckptflow.archive.probe import run_probe
from ckptflow.records import manifest as manifest_record
from ckptflow.records import receipt as receipt_record
from ckptflow.store.local import LocalStore
from helpers import REPO, preloaded
from helpers.cli import run_cli, wait_until
from helpers.procs import run_job
from helpers.tiny_models import build_tiny_base

RUN = "proj/grp/run1/20261129T000000Z"
EXAMPLE = REPO / "examples" / "train_hf_trainer.py"
PAUSE = "hf-export:after-seal"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_tiny_base("qwen3", tmp_path_factory.mktemp("hf") / "base")


@pytest.fixture
def archive(tmp_path) -> Path:
    root = tmp_path / "archive"
    root.mkdir()
    assert run_probe(LocalStore(root), "scratch").record.passed  # prune-verified requires a probe record
    return root


def train(base: Path, run_dir: Path, *args: str, ranks: int = 1, env: dict | None = None,
          wait: bool = True) -> subprocess.Popen | subprocess.CompletedProcess:
    launcher = [preloaded.TORCHRUN, "--standalone", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    argv = [sys.executable, *launcher, str(EXAMPLE), "--model", str(base), "--run-dir", str(run_dir), *args]
    env = {**os.environ, "CKPTFLOW_PROGRESS": "0", "OMP_NUM_THREADS": "1", **(env or {})}
    if ranks > 1:  # torchrun's agent and its workers fork from the hf template, as one process does
        env = preloaded.torchrun_env(env)
    return run_job(argv, cwd=REPO, env=env, wait=wait, preloaded="hf")


def result(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("{\"")]  # the main process's line only
    return json.loads(line)


def art(run_dir: Path, n: int) -> Path:
    return run_dir / "checkpoint_artifacts" / f"iter_{n:06d}"


def weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def files_of(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


def ckpt_inodes(directory: Path) -> dict[str, int]:
    return {rel: (directory / rel).stat().st_ino for rel in files_of(directory) if not rel.startswith(".")}


def owns_copy_of(artifact: Path, ckpt: Path) -> bool:
    """The artifact holds every file of ``ckpt`` byte for byte, each in an inode of its own (one name)."""
    own, theirs = ckpt_inodes(artifact), ckpt_inodes(ckpt)
    return (own.keys() == theirs.keys() and not set(own.values()) & set(theirs.values())
            and all((artifact / rel).stat().st_nlink == 1 for rel in own)
            and all((artifact / rel).read_bytes() == (ckpt / rel).read_bytes() for rel in own))


@pytest.mark.slow
def test_trainer_checkpoints_become_published_artifacts_that_resume_as_if_never_stopped(base, archive, tmp_path):
    straight = tmp_path / "straight" / RUN
    reference = result(train(base, straight, "--steps", "6", "--save-every", "2"))
    assert reference["exported"] == [2, 4, 6] and reference["published"] == []

    run_dir = tmp_path / "runs" / RUN
    flags = ("--steps", "6", "--save-every", "2", "--save-total-limit", "1", "--bucket", f"file://{archive}")
    flag = tmp_path / "pause"
    proc = train(base, run_dir, *flags, wait=False,
                 env={"CKPTFLOW_TEST_PAUSE_AT": PAUSE, "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    try:
        def stderr() -> str:
            return proc.communicate()[1][-4000:]

        for n in (2, 4):  # iter 2 goes on; the job is preempted (kill -9) right after sealing iter 4
            wait_until(flag.exists, proc, f"the export of iter {n} reached its pause point", 300, stderr)
            if n == 2:
                flag.unlink()
        # iter 2's publication runs in the background while iter 4 is paused: the preemption comes once it
        # is done (its receipt written), so the requeue has exactly iter 4 left to catch up on.
        wait_until(receipt_record.path_in(art(run_dir, 2)).is_file, proc,
                   "iter 2's background publication wrote its receipt", 300, stderr)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert manifest_record.path_in(art(run_dir, 4)).is_file()
    assert not receipt_record.path_in(art(run_dir, 4)).exists()  # its publication never started

    # The requeue (the same command): resumes from iter 4, publishes it first, then saves and publishes iter 6.
    requeued = result(train(base, run_dir, *flags))
    assert requeued["resumed_from"] == str(art(run_dir, 4)) and requeued["exported"] == [6]
    assert sorted(requeued["published"]) == ["iter_000004", "iter_000006"] and requeued["failed"] == []
    for n in (2, 4, 6):
        assert receipt_record.path_in(art(run_dir, n)).is_file()
        assert run_cli("verify", "--artifact-dir", str(art(run_dir, n))).returncode == 0
    # The Trainer's save_total_limit removed checkpoint-2 and -4; the artifacts keep their bytes, and the
    # last one holds checkpoint-6's bytes in files of its own (a reflink or a copy, never a hard link).
    assert sorted(p.name for p in run_dir.glob("checkpoint-*")) == ["checkpoint-6"]
    assert owns_copy_of(art(run_dir, 6), run_dir / "checkpoint-6")
    manifest = manifest_record.read_manifest(manifest_record.path_in(art(run_dir, 6)))
    assert {f.path for f in manifest.physical_files()} == files_of(run_dir / "checkpoint-6")
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "trainer_state.json", "rng_state.pth"} <= set(
        manifest.components)
    resumed, expected = weights(art(run_dir, 6)), weights(art(straight, 6))
    assert resumed.keys() == expected.keys() and all(resumed[k].equal(expected[k]) for k in expected)

    # prune-verified frees the published artifacts; resuming from a pruned one is refused, naming restore.
    shutil.rmtree(run_dir / "checkpoint-6")
    pruned = run_cli("prune-verified", "--paths", *(str(art(run_dir, n)) for n in (2, 4, 6)))
    assert pruned.returncode == 0, pruned.stderr
    assert not (art(run_dir, 6) / "model.safetensors").exists() and not (art(run_dir, 2) / "optimizer.pt").exists()
    more = ("--steps", "8", "--save-every", "2", "--bucket", f"file://{archive}")
    refused = train(base, run_dir, *more)
    assert refused.returncode == 3 and f"ckptflow restore --artifact-dir {art(run_dir, 6)}" in refused.stderr
    assert run_cli("restore", "--artifact-dir", str(art(run_dir, 6))).returncode == 0
    later = result(train(base, run_dir, *more))
    assert later["resumed_from"] == str(art(run_dir, 6)) and later["exported"] == [8] and later["global_step"] == 8
    assert later["published"] == ["iter_000008"]


@pytest.mark.slow
def test_two_ranks_check_the_destination_export_on_the_main_process_only_resume_and_refuse_a_restart_alike(base, archive, tmp_path):
    run_dir = tmp_path / "runs" / RUN
    # A destination the preflight (on by default) rejects stops both ranks at train begin, before any step.
    typo = train(base, run_dir, "--steps", "4", "--save-every", "2", "--bucket", f"file://{tmp_path}/archiv", ranks=2)
    assert typo.returncode != 0 and typo.stderr.count(f"{tmp_path}/archiv") >= 2, typo.stderr[-4000:]
    assert not list(run_dir.glob("checkpoint*")) and "'loss'" not in typo.stdout + typo.stderr

    flags = ("--save-every", "2", "--save-total-limit", "1", "--bucket", f"file://{archive}")
    first = train(base, run_dir, "--steps", "4", *flags, "--preflight", "on", ranks=2)
    out = result(first)
    assert out["exported"] == [2, 4] and out["published"] == ["iter_000002", "iter_000004"]
    assert first.stderr.count("archived ") == 2  # one publication each, by the main process only
    for n in (2, 4):
        names = files_of(art(run_dir, n))
        assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= names
        assert receipt_record.path_in(art(run_dir, n)).is_file()
    assert not (run_dir / "checkpoint-2").exists()  # save_total_limit; the artifact kept the bytes

    # A start behind the committed artifacts is refused on both ranks alike, nothing trained or written.
    before = sorted(p.name for p in (run_dir / "checkpoint_artifacts").iterdir())
    refused = train(base, run_dir, "--steps", "6", "--resume", "off", *flags, ranks=2)
    assert refused.returncode != 0 and refused.stderr.count("refusing to train at step 0") >= 2
    assert sorted(p.name for p in (run_dir / "checkpoint_artifacts").iterdir()) == before

    resumed = result(train(base, run_dir, "--steps", "6", *flags, ranks=2))
    assert resumed["resumed_from"] == str(art(run_dir, 4)) and resumed["exported"] == [6]
    assert resumed["global_step"] == 6 and resumed["published"] == ["iter_000006"]

    # The same command again (a requeue after the last step): both ranks end at train begin, no step taken.
    again = train(base, run_dir, "--steps", "6", *flags, ranks=2)
    done = result(again)
    assert done["complete"] and done["exported"] == [] and done["global_step"] == 6
    assert again.stderr.count("is already at step 6 of max_steps=6") == 1 and "'loss'" not in again.stdout + again.stderr
    assert not art(run_dir, 7).exists() and not (run_dir / "checkpoint-7").exists()


def fake_checkpoint(root: Path, seed: int = 0) -> Path:
    """A Trainer checkpoint's shape: files and a sharded subdirectory (as FSDP or DeepSpeed write one)."""
    (root / "pytorch_model_fsdp_0").mkdir(parents=True)
    for rel in ("model.safetensors", "optimizer.pt", "trainer_state.json", "pytorch_model_fsdp_0/__0_0.distcp"):
        (root / rel).write_bytes(os.urandom(1000 + seed))
    return root


EXPORT = ("import sys; from ckptflow.trainer.hf import export_checkpoint; "
          "export_checkpoint(sys.argv[1], sys.argv[2], int(sys.argv[3]))")


def export_in_process(ckpt: Path, run_dir: Path, n: int, **env: str) -> subprocess.CompletedProcess:
    return run_job([sys.executable, "-c", EXPORT, str(ckpt), str(run_dir), str(n)], cwd=REPO,
                   env={**os.environ, **env}, timeout=300, preloaded="hf")


@pytest.mark.slow
def test_an_export_killed_before_its_seal_is_done_again_and_a_foreign_file_is_refused_and_kept(tmp_path):
    ckpt, run_dir = fake_checkpoint(tmp_path / "checkpoint-5"), tmp_path / "runs" / RUN
    killed = export_in_process(ckpt, run_dir, 5, CKPTFLOW_TEST_KILL_AT="hf-export:before-seal")
    assert killed.returncode == -signal.SIGKILL
    assert not manifest_record.path_in(art(run_dir, 5)).exists()
    status = run_cli("status", str(run_dir), "--json")
    assert [r["local"]["state"] for r in status.report["rows"]] == ["incomplete"], status.stdout

    done = export_in_process(ckpt, run_dir, 5)  # the next save of iteration 5 discards its copies and copies again
    assert done.returncode == 0, done.stderr
    assert owns_copy_of(art(run_dir, 5), ckpt)
    manifest = manifest_record.read_manifest(manifest_record.path_in(art(run_dir, 5)))
    assert manifest.components["pytorch_model_fsdp_0"].to_dict()["format"] == "dcp"
    assert not (art(run_dir, 5) / ".save-in-progress").exists()
    again = export_in_process(ckpt, run_dir, 5)
    assert again.returncode == 1 and "is never overwritten" in again.stderr

    assert export_in_process(ckpt, run_dir, 7, CKPTFLOW_TEST_KILL_AT="hf-export:before-seal").returncode != 0
    (art(run_dir, 7) / "notes.txt").write_text("a user's file")
    refused = export_in_process(ckpt, run_dir, 7)
    assert refused.returncode == 1 and "notes.txt" in refused.stderr
    assert (art(run_dir, 7) / "notes.txt").read_text() == "a user's file"
    assert all((ckpt / rel).is_file() for rel in files_of(ckpt))


@pytest.mark.slow
def test_a_checkpoint_on_another_file_system_is_copied_then_sealed(tmp_path):
    from helpers.disks import tmpfs_mounts

    with tmpfs_mounts(tmp_path / "mnt") as mount:
        ckpt = fake_checkpoint(mount(1 << 20) / "checkpoint-3", seed=3)
        run_dir = tmp_path / "runs" / RUN
        done = export_in_process(ckpt, run_dir, 3)
        assert done.returncode == 0, done.stderr
        copied = art(run_dir, 3)
        assert {rel: (copied / rel).read_bytes() for rel in files_of(ckpt)} == {
            rel: (ckpt / rel).read_bytes() for rel in files_of(ckpt)}
        assert all((copied / rel).stat().st_dev != (ckpt / rel).stat().st_dev for rel in files_of(ckpt))
        assert run_cli("status", str(run_dir), "--json").report["rows"][0]["local"]["state"] == "committed"


# ------------------------------------------------------------------ checkpoint-N rewritten after the export

RESAVE = ("import sys, torch; from transformers import AutoModelForCausalLM; "
          "AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float16).save_pretrained(sys.argv[1])")


def rewrite_in_place(ckpt: Path, how: str) -> None:
    """What a user's tool does to ``checkpoint-N`` after the export: a Hugging Face re-save into the same
    directory, or a truncate-and-rewrite of one file with other bytes of the same size."""
    if how == "resave":
        done = run_job([sys.executable, "-c", RESAVE, str(ckpt)], cwd=REPO, env=dict(os.environ), timeout=300,
                       preloaded="hf")
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        path = ckpt / "config.json"
        data = path.read_bytes()
        with open(path, "wb") as fh:  # truncates the inode, then writes
            fh.write(data.replace(b"bfloat16", b"float16 "))
        assert path.stat().st_size == len(data)


def trainer_checkpoint(base: Path, ckpt: Path, step: int) -> Path:
    """``checkpoint-<step>`` as the Trainer saves one with its full state: the model (a copy of ``base``) and
    the optimizer, scheduler, RNG and trainer state a resume reads (placeholders but ``trainer_state.json``)."""
    shutil.copytree(base, ckpt)
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        (ckpt / name).write_bytes(os.urandom(256))
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": step}))
    return ckpt


def archive_it(art_dir: Path, archive: Path) -> None:
    published = run_cli("publish", "--artifact-dir", str(art_dir), "--bucket", f"file://{archive}")
    assert published.returncode == 0, published.stderr


def local_state(run_dir: Path) -> dict:
    [row] = run_cli("status", str(run_dir), "--json").report["rows"]
    return row["local"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["resave", "truncate-and-rewrite"])
@pytest.mark.parametrize("archived", [True, False], ids=["archived", "not-yet-archived"])
def test_a_rewrite_of_checkpoint_n_in_place_changes_no_committed_artifact(base, archive, tmp_path, how, archived):
    from ckptflow.trainer.hf import resume_point

    run_dir = tmp_path / "runs" / RUN
    ckpt = trainer_checkpoint(base, run_dir / "checkpoint-4", 4)
    assert export_in_process(ckpt, run_dir, 4).returncode == 0
    if archived:
        archive_it(art(run_dir, 4), archive)
    committed = {rel: (art(run_dir, 4) / rel).read_bytes() for rel in files_of(art(run_dir, 4))}

    rewrite_in_place(ckpt, how)

    assert (ckpt / "config.json").read_bytes() != committed["config.json"]
    assert {rel: (art(run_dir, 4) / rel).read_bytes() for rel in files_of(art(run_dir, 4))} == committed
    assert resume_point(run_dir) == str(art(run_dir, 4))
    assert local_state(run_dir)["state"] == "committed"
    if not archived:  # the "publish later" case: its bytes are still the committed ones
        archive_it(art(run_dir, 4), archive)
    verified = run_cli("verify", "--artifact-dir", str(art(run_dir, 4)), "--read-data")
    assert verified.returncode == 0, verified.stderr


@pytest.mark.slow
@pytest.mark.parametrize("how", ["resave", "truncate-and-rewrite"])
@pytest.mark.parametrize("archived", [True, False], ids=["archived", "not-yet-archived"])
def test_an_artifact_sharing_inodes_with_a_rewritten_checkpoint_is_named_damaged_with_the_remedy(
        base, archive, tmp_path, how, archived):
    """An artifact an older export hard-linked to ``checkpoint-N`` (or any artifact rewritten in place):
    resume_point, the resume guard and status never present it as committed and usable."""
    from ckptflow.artifact import ComponentSpec, seal_artifact
    from ckptflow.errors import Refused
    from ckptflow.trainer.hf import _component_name, resume_point

    run_dir = tmp_path / "runs" / RUN
    ckpt = trainer_checkpoint(base, run_dir / "checkpoint-4", 4)
    linked = art(run_dir, 4)
    linked.mkdir(parents=True)
    for rel in files_of(ckpt):
        (linked / rel).parent.mkdir(parents=True, exist_ok=True)
        (linked / rel).hardlink_to(ckpt / rel)
    seal_artifact(linked, 4, [ComponentSpec(_component_name(top), top) for top in sorted(os.listdir(ckpt))],
                  progress=False)
    if archived:
        archive_it(linked, archive)
    assert resume_point(run_dir) == str(linked) and local_state(run_dir)["state"] == "committed"

    rewrite_in_place(ckpt, how)

    with pytest.raises(Refused) as refused:
        resume_point(run_dir)
    message = str(refused.value)
    assert "is damaged" in message and "config.json" in message
    local = local_state(run_dir)
    assert local["state"] == "damaged" and "config.json" in local["detail"]
    if not archived:
        assert "archived nowhere" in message and "archived nowhere" in local["detail"]
        assert run_cli("publish", "--artifact-dir", str(linked), "--bucket", f"file://{archive}").returncode != 0
        return
    remedy = f"`ckptflow restore --artifact-dir {linked}`"
    assert remedy in message and remedy in local["detail"]
    # The remedy, followed: the changed files moved out, the archived bytes restored, the artifact usable again.
    from ckptflow.artifact import changed_payloads

    aside = tmp_path / "changed"
    for problem in changed_payloads(linked):
        rel = problem.split(" ")[0]
        (aside / rel).parent.mkdir(parents=True, exist_ok=True)
        os.rename(linked / rel, aside / rel)
    restored = run_cli("restore", "--artifact-dir", str(linked))
    assert restored.returncode == 0, restored.stderr
    assert resume_point(run_dir) == str(linked) and local_state(run_dir)["state"] == "committed"


# ------------------------------------------------------------------ the export off the training loop

def paused_at(flag: Path, point: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return point in flag.read_text()
        except FileNotFoundError:
            return False
    return check


def rewrite_same_size(path: Path) -> None:
    """Truncate ``path`` and write other bytes of the same size into the same inode."""
    data = path.read_bytes()
    other = data.swapcase()
    assert other != data
    with open(path, "wb") as fh:
        fh.write(other)


def bytes_of(directory: Path) -> dict[str, bytes]:
    return {rel: (directory / rel).read_bytes() for rel in files_of(directory) if not rel.startswith(".")}


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [1, 2])
def test_on_save_returns_before_the_export_and_a_rewrite_before_its_copy_stops_training_at_the_next_save(
        base, tmp_path, ranks):
    run_dir, flag = tmp_path / "runs" / RUN, tmp_path / "pause"
    flags = ("--steps", "4", "--save-every", "2", "--preflight", "off")
    # The background export of iteration 2 pauses before its first copy; the loop goes on to the next save.
    proc = train(base, run_dir, *flags, ranks=ranks, wait=False, env={
        "CKPTFLOW_TEST_PAUSE_AT": "hf-export:copying-iter2,hf-export:next-save-waits",
        "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    try:
        def stderr() -> str:
            return proc.communicate()[1][-4000:]

        wait_until(paused_at(flag, "hf-export:next-save-waits iter2"), proc,
                   "the save at step 4 waiting for the export of iteration 2", 300, stderr)
        # on_save of step 2 returned with nothing copied; steps 3 and 4 ran; the save at 4 has not started.
        assert not (art(run_dir, 2)).exists() and not (run_dir / "checkpoint-4").exists()
        rewrite_same_size(run_dir / "checkpoint-2" / "config.json")  # a user's tool, before the copy
        flag.unlink()
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode != 0
    refusals = [line for line in err.splitlines()
                if line.startswith("train_hf_trainer: ") and not line.startswith("train_hf_trainer: ERROR: ")]
    assert len(refusals) == ranks, err[-4000:]  # every rank stops with the same error
    assert len(set(refusals)) == 1 and "iteration 2" in refusals[0], refusals
    assert "checkpoint-2/config.json changed" in refusals[0] and "nothing was committed" in refusals[0]
    assert not manifest_record.path_in(art(run_dir, 2)).exists() and not (run_dir / "checkpoint-4").exists()
    assert local_state(run_dir)["state"] == "incomplete"
    if ranks > 1:
        return

    # The requeue (no artifact committed: a fresh start) saves checkpoint-2 again; its export discards the
    # refused copy by its ownership record; each artifact holds its checkpoint's bytes as the Trainer saved them.
    again = result(train(base, run_dir, *flags))
    assert again["resumed_from"] is None and again["exported"] == [2, 4]
    for n in (2, 4):
        assert owns_copy_of(art(run_dir, n), run_dir / f"checkpoint-{n}")
    assert [r["local"]["state"] for r in run_cli("status", str(run_dir), "--json").report["rows"]] == ["committed"] * 2


@pytest.mark.slow
@pytest.mark.parametrize("export", ["async", "sync"])
def test_a_rewrite_after_the_copy_never_reaches_the_committed_artifact(base, tmp_path, export):
    run_dir, flag = tmp_path / "runs" / RUN, tmp_path / "pause"
    proc = train(base, run_dir, "--steps", "2", "--save-every", "2", "--export", export, wait=False,
                 env={"CKPTFLOW_TEST_PAUSE_AT": "hf-export:copied-iter2", "CKPTFLOW_TEST_PAUSE_FILE": str(flag)})
    try:
        wait_until(paused_at(flag, "hf-export:copied-iter2"), proc, "the copies of iteration 2", 300,
                   lambda: proc.communicate()[1][-4000:])
        saved = bytes_of(run_dir / "checkpoint-2")
        rewrite_same_size(run_dir / "checkpoint-2" / "config.json")
        flag.unlink()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert result(subprocess.CompletedProcess([], proc.returncode, out, err))["exported"] == [2]
    assert bytes_of(art(run_dir, 2)) == saved != bytes_of(run_dir / "checkpoint-2")
    assert local_state(run_dir)["state"] == "committed"


@pytest.mark.slow
def test_a_background_export_killed_leaves_no_manifest_and_the_requeue_resumes_from_the_previous_artifact(
        base, tmp_path):
    run_dir = tmp_path / "runs" / RUN
    killed = train(base, run_dir, "--steps", "4", "--save-every", "2", env={
        "CKPTFLOW_TEST_KILL_AT": "hf-export:copied-iter4"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-4000:]
    assert manifest_record.path_in(art(run_dir, 2)).is_file()
    assert not manifest_record.path_in(art(run_dir, 4)).exists() and (art(run_dir, 4) / ".save-in-progress").exists()

    requeued = result(train(base, run_dir, "--steps", "6", "--save-every", "2"))
    assert requeued["resumed_from"] == str(art(run_dir, 2)) and requeued["exported"] == [4, 6]
    for n in (4, 6):
        assert owns_copy_of(art(run_dir, n), run_dir / f"checkpoint-{n}")
        assert not (art(run_dir, n) / ".save-in-progress").exists()
    assert [r["local"]["state"] for r in run_cli("status", str(run_dir), "--json").report["rows"]] == ["committed"] * 3


def test_the_callback_waits_for_the_export_only_where_the_trainer_may_rotate_or_delete_the_checkpoint(
        tmp_path, monkeypatch):
    """The callback's hooks called as the Trainer calls them (one process): the export of checkpoint-N runs
    while the loop goes on, and is committed before any point where the Trainer may delete checkpoint-N."""
    from types import SimpleNamespace

    from ckptflow.trainer.hf import ArtifactCallback

    def hooks(step: int, strategy: str = "steps", limit: int | None = None, best: str | None = None):
        args = SimpleNamespace(output_dir=str(tmp_path / "out"), save_total_limit=limit, save_strategy=strategy)
        state = SimpleNamespace(global_step=step, max_steps=8, best_model_checkpoint=best)
        return args, state

    def control(save: bool = False, stop: bool = False):
        return SimpleNamespace(should_save=save, should_training_stop=stop)

    def committed(n: int) -> bool:
        return manifest_record.path_in(art(run_dir, n)).is_file()

    run_dir, flag = tmp_path / "runs" / RUN, tmp_path / "pause"
    for n in (2, 4, 6, 8):
        fake_checkpoint(tmp_path / "out" / f"checkpoint-{n}", seed=n)
    callback = ArtifactCallback(run_dir)
    monkeypatch.setenv("CKPTFLOW_TEST_PAUSE_AT", "hf-export:copying-iter2")
    monkeypatch.setenv("CKPTFLOW_TEST_PAUSE_FILE", str(flag))
    callback.on_save(*hooks(2), control())
    wait_until(flag.exists, SimpleNamespace(poll=lambda: None), "the export of iteration 2 paused before its copy")
    callback.on_step_end(*hooks(3), control())  # a step without a save: the loop goes on
    callback.on_evaluate(*hooks(3), control())  # an evaluation that no save follows
    assert not art(run_dir, 2).exists() and callback.exported == []
    flag.unlink()
    callback.on_step_end(*hooks(4), control(save=True))  # the save at 4 (its rotation) waits for iteration 2
    assert committed(2) and callback.exported == [2]
    assert owns_copy_of(art(run_dir, 2), tmp_path / "out" / "checkpoint-2")

    callback.on_save(*hooks(4, strategy="best"), control())
    callback.on_evaluate(*hooks(5, strategy="best"), control())  # save_strategy="best": a save may follow
    assert committed(4) and callback.exported == [2, 4]
    callback.on_save(*hooks(6), control())
    callback.on_epoch_end(*hooks(6), control(save=True))
    assert committed(6) and callback.exported == [2, 4, 6]
    # The last save, save_total_limit=1 with a best checkpoint: the Trainer's end deletes the others before
    # on_train_end, so on_save itself waits.
    callback.on_save(*hooks(8, limit=1, best=str(tmp_path / "out" / "checkpoint-2")), control(stop=True))
    assert committed(8) and callback.exported == [2, 4, 6, 8]
    callback.on_train_end(*hooks(8), control())
    assert callback.exported == [2, 4, 6, 8]
