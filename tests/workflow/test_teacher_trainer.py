"""materialize_teacher from a Hugging Face Trainer artifact (TRL's SFTTrainer with the ckptflow callback, a
full fine-tune of a tiny model for 2 CPU steps): the teacher is its model files as they are."""

from __future__ import annotations

import json

import pytest
from workflow_helpers import RUN, Flow

from ckptflow.fsutil import walk_files
from helpers.trainer_artifacts import STEPS, train_sft


@pytest.mark.slow
def test_materialize_teacher_builds_from_a_full_trainer_artifact_then_has_nothing_to_do(tmp_path, kit):
    flow = Flow(tmp_path, {"base": str(kit.base), "run": RUN, "materialize": {"min_tensors": 1}})
    art = train_sft(kit.base, flow.runs / RUN)
    assert art == flow.artifact(STEPS)
    assert flow.planned("materialize_teacher", iter=STEPS) == ["materialize", "materialize_teacher"]
    flow.ok("materialize_teacher", iter=STEPS)
    report = json.loads(flow.report("materialize", STEPS).read_text())
    assert report["status"] == "built" and report["source"]["location"] == str(art)
    assert report["options"] == {"trainer_artifact": "full"}
    teacher = flow.teacher(STEPS)
    files = set(walk_files(teacher))
    assert "model.safetensors" in files and "config.json" in files and ".materialized" in files
    assert not files & {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"}
    assert all((teacher / f).read_bytes() == (art / f).read_bytes() for f in files - {".materialized"})
    assert flow.planned("materialize_teacher", iter=STEPS) == []
