"""TRL's ``SFTTrainer`` with the Hugging Face callback (``ckptflow.trainer.hf``) through
``examples/train_trl_sft.py``: a full fine-tune and LoRA adapters (PEFT) on a tiny Qwen3 built offline, text from
``datasets.Dataset.from_dict``, a few CPU steps in real processes, publishing to a file:// archive. A run killed
(SIGKILL) at a save and again during its last publication resumes bitwise equal to an uninterrupted one and ends
at ``max_steps``; a ``save_only_model`` run is refused by ``resume_point``, by the callback's start check and by
``ckptflow resume-check`` alike. Also the rule that tells a complete Trainer checkpoint from a model-only one,
and the remedies every refusal names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptflow.archive.probe import run_probe
from ckptflow.records import manifest as manifest_record
from ckptflow.records import receipt as receipt_record
from ckptflow.store.local import LocalStore
from helpers import REPO
from helpers.cli import run_cli, wait_until
from helpers.procs import kill_job, run_job
from helpers.tiny_models import build_tiny_base

RUN = "proj/grp/run1/20261129T000000Z"
EXAMPLE = REPO / "examples" / "train_trl_sft.py"
STATE_FILES = ("optimizer.pt", "scheduler.pt", "rng_state.pth")


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return build_tiny_base("qwen3", tmp_path_factory.mktemp("trl") / "base")


@pytest.fixture
def archive(tmp_path) -> Path:
    root = tmp_path / "archive"
    root.mkdir()
    assert run_probe(LocalStore(root), "scratch").record.passed
    return root


def sft(base: Path, run_dir: Path, *args: str, env: dict | None = None,
        wait: bool = True) -> subprocess.Popen | subprocess.CompletedProcess:
    argv = [sys.executable, str(EXAMPLE), "--model", str(base), "--run-dir", str(run_dir), *args]
    env = {**os.environ, "CKPTFLOW_PROGRESS": "0", "OMP_NUM_THREADS": "1", **(env or {})}
    return run_job(argv, cwd=REPO, env=env, wait=wait, preloaded="hf")


def result(proc) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("{\"")]
    return json.loads(line)


def art(run_dir: Path, n: int) -> Path:
    return run_dir / "checkpoint_artifacts" / f"iter_{n:06d}"


def tensors(path: Path, lora: bool) -> dict:
    from safetensors.torch import load_file

    return load_file(path / ("adapter_model.safetensors" if lora else "model.safetensors"))


def paused_then_killed(proc: subprocess.Popen, flag: Path, steps: list[tuple[str, object]]) -> None:
    """Drive a job that pauses at test points, then SIGKILL it: for each (what, action), "go" waits for the
    job's pause file (written by this job: its pid) and releases the pause, "hold" waits for it and keeps the
    job paused, a callable is waited on. The pause file of the killed job goes with it."""
    def stderr() -> str:
        return proc.communicate()[1][-4000:]

    def paused() -> bool:
        try:
            return flag.read_text().split()[0] == str(proc.pid)
        except (FileNotFoundError, IndexError):
            return False

    try:
        for what, action in steps:
            wait_until(paused if action in ("go", "hold") else action, proc, what, 300, stderr)
            if action == "go":
                flag.unlink()
        kill_job(proc)
    finally:
        if proc.poll() is None:
            kill_job(proc)
        proc.communicate()
        flag.unlink(missing_ok=True)


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sft_resumes_bitwise_after_sigkill_and_a_requeue_after_the_last_publication_trains_nothing(
        base, archive, tmp_path, lora):
    from ckptflow.trainer.hf import resume_point

    kind = ("--lora",) if lora else ()
    straight = tmp_path / "straight" / RUN
    reference = result(sft(base, straight, "--steps", "6", "--save-every", "2", *kind))
    assert reference["exported"] == [2, 4, 6] and reference["global_step"] == 6

    run_dir, flag = tmp_path / "runs" / RUN, tmp_path / "pause"
    flags = ("--steps", "6", "--save-every", "2", "--save-total-limit", "1", "--bucket", f"file://{archive}", *kind)
    pause = {"CKPTFLOW_TEST_PAUSE_FILE": str(flag)}
    # Killed right after sealing iter 4, once iter 2's background publication wrote its receipt.
    first = sft(base, run_dir, *flags, wait=False, env={**pause, "CKPTFLOW_TEST_PAUSE_AT": "hf-export:after-seal"})
    paused_then_killed(first, flag, [("the export of iter 2", "go"), ("the export of iter 4", "hold"),
                                     ("iter 2's receipt", receipt_record.path_in(art(run_dir, 2)).is_file)])
    assert manifest_record.path_in(art(run_dir, 4)).is_file() and not receipt_record.path_in(art(run_dir, 4)).exists()

    # The requeue resumes from iter 4 and publishes it, saves iter 6 and is killed during iter 6's publication
    # (its payloads, declaration and manifest archived, no receipt yet): the last step is committed.
    second = sft(base, run_dir, *flags, wait=False, env={**pause, "CKPTFLOW_TEST_PAUSE_AT": "publish:before-receipt"})
    paused_then_killed(second, flag, [("iter 4's publication", "go"),
                                      ("iter 4's receipt", receipt_record.path_in(art(run_dir, 4)).is_file),
                                      ("iter 6's publication", "hold")])
    assert manifest_record.path_in(art(run_dir, 6)).is_file() and not receipt_record.path_in(art(run_dir, 6)).exists()
    resumed, expected = tensors(art(run_dir, 6), lora), tensors(art(straight, 6), lora)
    assert resumed.keys() == expected.keys() and all(resumed[k].equal(expected[k]) for k in expected)
    names = {f.path for f in manifest_record.read_manifest(art(run_dir, 6)).physical_files()}
    assert set(STATE_FILES) | {"trainer_state.json"} <= names
    assert ("adapter_config.json" in names) == lora and ("model.safetensors" in names) != lora

    # resume-check and resume_point agree: the complete Trainer artifact is the resume point.
    assert resume_point(run_dir) == str(art(run_dir, 6))
    check = run_cli("resume-check", "--attempt-dir", str(run_dir))
    assert check.returncode == 0 and check.report["resume_from"] == str(art(run_dir, 6)), check.stdout
    named = run_cli("resume-check", "--attempt-dir", str(run_dir), "--resume-path", str(art(run_dir, 6)))
    assert named.returncode == 0 and named.report["resume_iteration"] == 6, named.stdout

    # The same command once more: at max_steps already, it catches up iter 6's publication and ends there.
    third = sft(base, run_dir, *flags)
    done = result(third)
    assert done["complete"] and done["resumed_from"] == str(art(run_dir, 6)) and done["exported"] == []
    assert done["global_step"] == 6 and done["published"] == ["iter_000006"] and done["failed"] == []
    assert "is already at step 6 of max_steps=6" in third.stderr and "training ends here" in third.stderr
    assert "'loss'" not in third.stdout + third.stderr  # no step was taken
    assert not art(run_dir, 7).exists() and not (run_dir / "checkpoint-7").exists()
    for n in (2, 4, 6):
        assert run_cli("verify", "--artifact-dir", str(art(run_dir, n))).returncode == 0
    assert tensors(art(run_dir, 6), lora).keys() == expected.keys()


@pytest.mark.slow
def test_a_save_only_model_run_is_refused_by_resume_point_the_start_check_and_resume_check(base, tmp_path):
    from ckptflow.errors import Refused
    from ckptflow.trainer.hf import resume_point

    run_dir = tmp_path / "runs" / RUN
    first = sft(base, run_dir, "--steps", "4", "--save-every", "2", "--save-only-model")
    assert result(first)["exported"] == [2, 4]
    assert "save_only_model=True: every artifact of this run is model-only" in first.stderr
    newest = art(run_dir, 4)
    assert not any((newest / name).exists() for name in STATE_FILES) and (newest / "trainer_state.json").is_file()

    with pytest.raises(Refused) as refused:
        resume_point(run_dir)
    message = str(refused.value)
    assert f"committed artifact {newest} and nothing resumable (it is a model-only artifact" in message
    assert "save_only_model=True" in message
    assert all(name in message for name in STATE_FILES)
    assert f'from_pretrained("{newest}")' in message and "save_only_model=False" in message
    assert (newest / "config.json").is_file() and (newest / "model.safetensors").is_file()  # what the remedy names

    check = run_cli("resume-check", "--attempt-dir", str(run_dir))
    assert check.returncode == 1 and check.report["reason"] in message, check.stdout
    assert all(remedy in message for remedy in check.report["remedies"])
    named = run_cli("resume-check", "--attempt-dir", str(run_dir), "--resume-path", str(newest))
    assert named.returncode == 1 and "is a model-only artifact" in named.report["reason"], named.stdout
    assert all(name in named.report["reason"] for name in STATE_FILES)

    before = sorted(p.name for p in run_dir.iterdir())
    requeued = sft(base, run_dir, "--steps", "6", "--save-every", "2")  # resume_point refuses: nothing trained
    assert requeued.returncode == 3 and check.report["reason"] in requeued.stderr, requeued.stderr[-3000:]
    # Handed to the Trainer directly, the model-only artifact is refused by the callback's start check.
    direct = sft(base, run_dir, "--steps", "6", "--save-every", "2", "--resume-from", str(newest))
    assert direct.returncode == 3, direct.stderr[-3000:]
    assert f"refusing to train {run_dir} from step 4: {newest} is a model-only artifact" in direct.stderr
    assert "'loss'" not in direct.stdout + direct.stderr
    assert sorted(p.name for p in run_dir.iterdir()) == before and not art(run_dir, 6).exists()


# ------------------------------------------------------------------ the rule, on sealed artifacts (no training)

def sealed(run_dir: Path, n: int, files: list[str], state_step: int | None = None) -> Path:
    """A Trainer artifact as the callback exports one: one component per top-level entry."""
    from ckptflow.artifact import ComponentSpec, seal_artifact
    from ckptflow.trainer.hf import _component_name

    d = art(run_dir, n)
    for rel in files:
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"global_step": n if state_step is None else state_step}) if rel == "trainer_state.json" else rel
        (d / rel).write_text(body)
    seal_artifact(d, n, [ComponentSpec(_component_name(top), top) for top in sorted({r.split("/")[0] for r in files})],
                  progress=False)
    return d


MODEL = ["config.json", "model.safetensors", "trainer_state.json", "training_args.bin"]
LORA = ["adapter_config.json", "adapter_model.safetensors", "trainer_state.json", "training_args.bin"]


@pytest.mark.parametrize(("files", "missing"), [
    ([*MODEL, "optimizer.pt", "scheduler.pt", "rng_state.pth"], []),
    (MODEL, ["optimizer.pt", "scheduler.pt", "rng_state.pth"]),
    ([*LORA, "optimizer.pt", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"], []),
    ([*MODEL, "optimizer.pt", "scheduler.pt", "rng_state_0.pth", "rng_state_2.pth"], ["rng_state_1.pth"]),
    ([*MODEL, "scheduler.pt", "rng_state.pth", "optimizer_0/__0_0.distcp"], []),  # FSDP's sharded optimizer
    ([*MODEL, "rng_state_0.pth", "global_step6/mp_rank_00_model_states.pt", "latest"], []),  # DeepSpeed
    ([*MODEL, "optimizer.pt", "rng_state.pth"], ["scheduler.pt"]),
], ids=["complete", "save_only_model", "lora-two-ranks", "a-rank-missing", "fsdp", "deepspeed", "no-scheduler"])
def test_a_trainer_artifact_is_resumable_when_it_holds_the_full_state_and_is_refused_naming_what_it_lacks(
        tmp_path, files, missing):
    from ckptflow.trainer.resume import check_run_attempt, trainer_artifact_missing

    run_dir = tmp_path / RUN
    newest = sealed(run_dir, 6, files)
    assert trainer_artifact_missing(newest) == missing
    auto, named = check_run_attempt(run_dir), check_run_attempt(run_dir, resume_path=newest)
    if not missing:
        assert auto.decision == named.decision == "resume" and auto.resume_from == named.resume_from == str(newest)
        assert named.resume_iteration == 6
        return
    for d in (auto, named):
        assert d.decision == "refused" and "is a model-only artifact" in d.reason
        assert all(name in d.reason for name in missing)


def test_every_remedy_names_files_that_exist(tmp_path):
    """The model a new run starts from: the artifact directory of a Trainer checkpoint (a Hugging Face model
    or a LoRA adapter over its base), the ``model`` file of a native artifact; a pruned one is restored first."""
    from ckptflow.trainer.resume import check_run_attempt

    hf = sealed(tmp_path / "hf" / RUN, 4, MODEL)
    lora = sealed(tmp_path / "lora" / RUN, 4, LORA)
    native = art(tmp_path / "native" / RUN, 4)
    native.mkdir(parents=True)
    (native / "weights.pt").write_bytes(b"w")
    from ckptflow.artifact import ComponentSpec, seal_artifact

    seal_artifact(native, 4, [ComponentSpec("model", "weights.pt")], progress=False)
    for artifact, named, exists in ((hf, f'from_pretrained("{hf}")', hf / "config.json"),
                                    (lora, f'PeftModel.from_pretrained(base, "{lora}")', lora / "adapter_config.json"),
                                    (native, f"init from {native}/weights.pt", native / "weights.pt")):
        d = check_run_attempt(artifact.parent.parent)
        assert d.decision == "refused" and named in d.remedies[0] and exists.is_file(), d.remedies
        assert "model.pt" not in " ".join(d.remedies)
    (hf / "model.safetensors").unlink()  # pruned: the remedy restores it first
    d = check_run_attempt(hf.parent.parent)
    assert f"once `ckptflow restore --artifact-dir {hf}` put back its 1 pruned file(s)" in d.remedies[0]


def test_a_trainer_state_that_disagrees_with_the_manifest_is_no_resume_point(tmp_path):
    from ckptflow.trainer.resume import check_run_attempt

    run_dir = tmp_path / RUN
    newest = sealed(run_dir, 6, MODEL + list(STATE_FILES), state_step=5)
    d = check_run_attempt(run_dir, resume_path=newest)
    assert d.decision == "refused" and "global_step=5" in d.reason and "iteration 6" in d.reason


def test_the_start_check_judges_the_trainers_own_checkpoint_where_no_artifact_is_committed(tmp_path):
    """``Trainer.train(resume_from_checkpoint=True)`` resumes ``output_dir/checkpoint-N``: a start at N with no
    committed ``iter_N`` is judged by that checkpoint's files."""
    from ckptflow.errors import Refused
    from ckptflow.trainer.hf import refuse_a_model_only_start

    run_dir = tmp_path / RUN
    ckpt = run_dir / "checkpoint-4"
    ckpt.mkdir(parents=True)
    for name in MODEL:
        (ckpt / name).write_text(name)
    with pytest.raises(Refused) as refused:
        refuse_a_model_only_start(run_dir, run_dir, 4)
    assert f"{ckpt} is a model-only checkpoint" in str(refused.value)
    assert all(name in str(refused.value) for name in STATE_FILES) and "save_only_model=False" in str(refused.value)
    refuse_a_model_only_start(run_dir, run_dir, 0)  # a fresh start reads no checkpoint
    for name in STATE_FILES:
        (ckpt / name).write_text(name)
    refuse_a_model_only_start(run_dir, run_dir, 4)  # the full state: a resume as exact as the Trainer's
    sealed(run_dir, 4, MODEL)  # a committed iter_4 is what the run resumed from, and it is model-only
    with pytest.raises(Refused, match="iter_000004 is a model-only artifact"):
        refuse_a_model_only_start(run_dir, run_dir, 4)
