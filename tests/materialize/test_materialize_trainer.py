"""A teacher from a Hugging Face Trainer artifact (``materialize.hf_artifact``): TRL's SFTTrainer trains a tiny
Qwen3 for 2 CPU steps with the ckptflow callback, a full fine-tune and a LoRA run, published to a file://
archive; ``ckptflow materialize`` builds the teacher from the full artifact as it is (local, or pruned and
fetched) and from the LoRA artifact merged into its base, verified against PEFT's own merge."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from materialize_helpers import cli_args

from ckptflow.archive.probe import run_probe
from ckptflow.artifact import ComponentSpec, seal_artifact
from ckptflow.fsutil import walk_files
from ckptflow.jsonio import validate
from ckptflow.records import manifest as manifest_record
from ckptflow.records import materialized as marker
from ckptflow.store.local import LocalStore
from helpers import tiny_models as tm
from helpers.cli import run_cli
from helpers.trainer_artifacts import train_sft
from helpers.trees import tree_state

pytestmark = pytest.mark.slow  # each trains or loads a model with torch

FULL_RUN = "proj/grp/full/20261129T000000Z"
LORA_RUN = "proj/grp/lora/20261129T000000Z"
MODEL_FILES = {"chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json"}
STATE_FILES = {"optimizer.pt", "rng_state.pth", "scheduler.pt", "trainer_state.json", "training_args.bin"}


@dataclass(frozen=True)
class Trained:
    base: Path
    archive: Path
    full: Path  # checkpoint_artifacts/iter_000002 of a full fine-tune, published
    lora: Path  # the same of a LoRA run, published


def probed_archive(root: Path) -> Path:
    root.mkdir(parents=True)
    assert run_probe(LocalStore(root), "scratch").record.passed  # prune-verified requires a probe record
    return root


@pytest.fixture(scope="session")
def trained(models, tmp_path_factory) -> Trained:
    root = tmp_path_factory.mktemp("trainer-artifacts")
    archive = probed_archive(root / "archive")
    base = models.base()
    full = train_sft(base, root / "runs" / FULL_RUN, archive=archive)
    lora = train_sft(base, root / "runs" / LORA_RUN, lora=True, archive=archive)
    return Trained(base, archive, full, lora)


def materialize_cli(source: Path | str, out: Path, *more: str, base: Path | None = None):
    args = cli_args(source, base or Path("unused"), out, *more)
    if base is None:  # a full Trainer artifact is its own base
        i = args.index("--base")
        del args[i:i + 2]
    return run_cli(*args, env={"CKPTFLOW_PROGRESS": "0"}, timeout=600)


def loaded_state(model_dir: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    with tm.quiet_transformers():
        return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype="auto").state_dict()


def peft_merge(base: Path, adapter: Path) -> dict[str, torch.Tensor]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with tm.quiet_transformers(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype="auto")
        return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().state_dict()


def files_of(directory: Path) -> set[str]:
    return set(walk_files(directory))


def test_a_full_trainer_artifact_is_the_teacher_as_it_is_then_skipped(trained, tmp_path):
    out = tmp_path / "teacher"
    proc = materialize_cli(trained.full, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.report
    validate(report, "report_materialize", what="materialize report")
    assert report["status"] == "built" and report["options"] == {"trainer_artifact": "full"}
    assert report["source"]["kind"] == "ckpt-dir" and report["source"]["model_path"] == "model.safetensors"
    assert report["base"]["path"] == str(trained.full)  # its own base: no --base was given
    checks = report["verification"]["checks"]
    assert {"file_digests", "tensors_equal_artifact", "loaders"} <= set(checks)
    # The model's files, byte for byte, and nothing of the Trainer's state; no conversion.
    assert files_of(out) == MODEL_FILES | {marker.FILENAME}
    assert all((out / f).read_bytes() == (trained.full / f).read_bytes() for f in MODEL_FILES)
    record = marker.read_materialized(out)
    assert {e.path for e in record.shards} == MODEL_FILES
    from safetensors.torch import load_file

    artifact = load_file(trained.full / "model.safetensors")
    teacher = loaded_state(out)
    assert all(torch.equal(teacher[k], v) for k, v in artifact.items())

    state = tree_state(out)
    again = materialize_cli(trained.full, out)
    assert again.returncode == 0 and again.report["status"] == "skipped", again.stderr[-3000:]
    assert tree_state(out) == state
    # A --base is accepted and not used: the same teacher.
    same = materialize_cli(trained.full, out, base=trained.base)
    assert same.returncode == 0 and same.report["status"] == "skipped", same.stderr[-3000:]


def test_a_pruned_full_trainer_artifact_fetches_only_its_model_files(models, tmp_path):
    archive = probed_archive(tmp_path / "archive")
    art = train_sft(models.base(), tmp_path / "runs" / FULL_RUN, archive=archive)
    pruned = run_cli("prune-verified", "--paths", str(art))
    assert pruned.returncode == 0, pruned.stderr[-3000:]
    assert not (art / "model.safetensors").exists()

    out = tmp_path / "teacher"
    proc = materialize_cli(art, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.report
    uri = f"file://{archive}/{FULL_RUN}/checkpoint_artifacts/iter_000002"
    assert report["status"] == "built" and report["source"]["kind"] == "artifact-uri"
    assert report["source"]["location"] == uri and marker.read_materialized(out).source.uri == uri
    assert set(report["fetch"]["downloaded"]) == MODEL_FILES  # never optimizer.pt, rng or trainer state
    assert report["staging"]["kept"] is False and not (tmp_path / "teacher.stage").exists()
    assert files_of(out) == MODEL_FILES | {marker.FILENAME}
    manifest = manifest_record.read_manifest(art)
    digests = {c.path: c.sha256 for c in manifest.components.values()}
    assert {e.path: e.sha256 for e in marker.read_materialized(out).shards} == {f: digests[f] for f in MODEL_FILES}

    again = materialize_cli(art, out)
    assert again.returncode == 0 and again.report["status"] == "skipped", again.stderr[-3000:]
    assert again.report["fetch"] is None  # decided on the remote manifest alone


def test_a_lora_artifact_is_merged_into_its_base_as_peft_merges_it(trained, tmp_path):
    out = tmp_path / "teacher"
    proc = materialize_cli(trained.lora, out, base=trained.base)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = proc.report
    validate(report, "report_materialize", what="materialize report")
    assert report["status"] == "built" and report["options"]["trainer_artifact"] == "lora"
    assert report["source"]["model_path"] == "adapter_model.safetensors"
    assert "merged_tensors_equal_peft" in report["verification"]["checks"]
    assert (out / "config.json").read_bytes() == (trained.base / "config.json").read_bytes()
    assert not any(name.startswith(("adapter_", "optimizer")) for name in files_of(out))

    merged, teacher, base = peft_merge(trained.base, trained.lora), loaded_state(out), loaded_state(trained.base)
    assert teacher.keys() == merged.keys()
    assert all(torch.equal(teacher[k], merged[k]) for k in merged)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(teacher[q], base[q])  # the adapter's training is in the teacher

    # From the archive: only the adapter's two files are fetched.
    uri = f"file://{trained.archive}/{LORA_RUN}/checkpoint_artifacts/iter_000002"
    other = materialize_cli(uri, tmp_path / "teacher2", base=trained.base)
    assert other.returncode == 0, other.stderr[-3000:]
    assert set(other.report["fetch"]["downloaded"]) == {"adapter_config.json", "adapter_model.safetensors"}
    assert all((tmp_path / "teacher2" / e.path).read_bytes() == (out / e.path).read_bytes()
               for e in marker.read_materialized(out).shards)


def test_a_lora_artifact_on_another_base_or_without_one_is_refused_by_name(trained, tmp_path):
    other = tm.build_tiny_base("qwen3", tmp_path / "other-base", seed=1)
    out = tmp_path / "teacher"
    proc = materialize_cli(trained.lora, out, base=other)
    assert proc.returncode == 1 and not out.exists()
    line = proc.stderr.strip().splitlines()[-1]
    named = json.loads((trained.lora / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert f"trained on {named!r}" in line and str(other) in line and "base_model_name_or_path" in line, line
    missing = materialize_cli(trained.lora, out)
    assert missing.returncode == 2 and "--base is required" in missing.stderr and not out.exists()


def test_an_artifact_with_no_model_at_all_is_refused_naming_its_components(trained, tmp_path):
    art = tmp_path / "runs" / "p" / "checkpoint_artifacts" / "iter_000002"
    art.mkdir(parents=True)
    for name in ("optimizer.pt", "trainer_state.json"):
        (art / name).write_bytes((trained.full / name).read_bytes())
    seal_artifact(art, 2, [ComponentSpec("optimizer.pt", "optimizer.pt"),
                           ComponentSpec("trainer_state.json", "trainer_state.json")], progress=False)
    out = tmp_path / "teacher"
    proc = materialize_cli(art, out, base=trained.base)
    assert proc.returncode == 1 and not out.exists()
    line = proc.stderr.strip().splitlines()[-1]
    assert "holds no model to materialize" in line and "its components: optimizer.pt, trainer_state.json" in line, line
    assert "absent (components" not in line and "))" not in line


def test_unified_chat_template_reads_the_full_artifacts_own_templates_before_anything_is_written(trained, tmp_path):
    """A Trainer under transformers v5 saves its tokenizer's template as chat_template.jinja and no processor
    template (chat_template.json): --unified-chat-template refuses the artifact by name, as it refuses such a
    base, before any build."""
    out = tmp_path / "teacher"
    proc = materialize_cli(trained.full, out, "--unified-chat-template")
    assert proc.returncode == 1 and not out.exists() and not list(tmp_path.iterdir())
    line = proc.stderr.strip().splitlines()[-1]
    assert "REFUSED before anything is published" in line and f"{trained.full} has no chat_template.json" in line, line


def test_an_adapter_peft_cannot_merge_is_refused_by_name(trained, tmp_path):
    art = tmp_path / "runs" / "p" / "checkpoint_artifacts" / "iter_000002"
    art.mkdir(parents=True)
    config = json.loads((trained.lora / "adapter_config.json").read_text())
    (art / "adapter_config.json").write_text(json.dumps({**config, "peft_type": "PROMPT_TUNING"}))
    (art / "adapter_model.safetensors").write_bytes((trained.lora / "adapter_model.safetensors").read_bytes())
    seal_artifact(art, 2, [ComponentSpec(n, n) for n in ("adapter_config.json", "adapter_model.safetensors")],
                  progress=False)
    out = tmp_path / "teacher"
    proc = materialize_cli(art, out, base=trained.base)
    assert proc.returncode == 1 and not out.exists()
    line = proc.stderr.strip().splitlines()[-1]
    assert f"{art}/adapter_config.json is a PROMPT_TUNING adapter" in line and "merge_and_unload" in line, line


def test_status_tells_a_trainer_artifacts_teacher_from_a_foreign_one(trained, tmp_path):
    """``ckptflow status`` compares a teacher's source digest with the artifact's: for a Trainer artifact the
    digest of the inventory of the files its teacher reads. The LoRA run's teacher slot holding the full run's
    teacher is foreign."""
    teachers = tmp_path / "teachers"
    for run in (FULL_RUN, LORA_RUN):
        proc = materialize_cli(trained.full, teachers / run / "iter_000002")
        assert proc.returncode == 0, proc.stderr[-3000:]
    status = run_cli("status", str(trained.full.parents[5]), "--teachers-dir", str(teachers))
    assert status.returncode == 0, status.stderr[-3000:]
    rows = {r["run"]: r["materialized"] for r in status.report["rows"]}
    assert rows[FULL_RUN]["state"] == "materialized" and rows[LORA_RUN]["state"] == "foreign", rows


def test_force_replaces_a_model_pt_teacher_with_a_trainer_one(models, trained, tmp_path):
    """What a model.pt build wrote (its base's sidecars included) is what a forced Trainer build may remove."""
    out = tmp_path / "teacher"
    first = run_cli(*cli_args(models.artifact(), models.base(), out), env={"CKPTFLOW_PROGRESS": "0"}, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    refused = materialize_cli(trained.full, out)
    assert refused.returncode == 1 and "--force" in refused.stderr
    forced = materialize_cli(trained.full, out, "--force")
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert forced.report["status"] == "built" and forced.report["replaced_identity"] is not None
    assert files_of(out) == MODEL_FILES | {marker.FILENAME}
