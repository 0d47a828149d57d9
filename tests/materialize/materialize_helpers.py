"""Helpers for the materialize tests: tiny real artifacts built once per session, tree snapshots, the CLI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from ckptflow.artifact import ComponentSpec, seal_artifact
from helpers import tiny_models as tm

# Tiny bases hold a few dozen tensors: the default floor of 800 would refuse them.
MIN = 1
SHARD_CAP = 100_000  # several shards per tiny export
# What every in-process call passes unless a test says otherwise.
DEFAULTS = {"min_tensors": MIN, "max_shard_bytes": SHARD_CAP, "progress": False}


class Models:
    """Tiny bases and sealed artifacts (``checkpoint_artifacts/iter_000300`` with model.pt), each built once.

    ``artifact(kind, seed)``: the base's weights perturbed with ``seed``, so two seeds are two sources of
    the same shapes. Everything here is shared and read-only by convention: tests copy what they damage.
    """

    def __init__(self, root: Path):
        self.root = root
        self._bases: dict[str, Path] = {}
        self._states: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
        self._artifacts: dict[tuple[str, int], Path] = {}

    def base(self, kind: str = "qwen3") -> Path:
        if kind not in self._bases:
            self._bases[kind] = tm.build_tiny_base(kind, self.root / "bases" / kind)
        return self._bases[kind]

    def state_dict(self, kind: str = "qwen3", seed: int = 1) -> dict[str, torch.Tensor]:
        if (kind, seed) not in self._states:
            self._states[kind, seed] = tm.perturbed(tm.in_memory_state_dict(self.base(kind)), scale=0.02, seed=seed)
        return self._states[kind, seed]

    def artifact(self, kind: str = "qwen3", seed: int = 1) -> Path:
        if (kind, seed) not in self._artifacts:
            art = self.root / "runs" / f"{kind}-{seed}" / "checkpoint_artifacts" / "iter_000300"
            tm.save_consolidated(self.state_dict(kind, seed), art / "model.pt")
            seal_artifact(art, 300, [ComponentSpec("model", "model.pt")], progress=False)
            self._artifacts[kind, seed] = art
        return self._artifacts[kind, seed]


def copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst




def siblings(out: Path) -> list[str]:
    """Entries beside ``out`` whose name starts with ``out``'s (staged, previous, stage directories), except
    the lock file ``<out>.lock``, which another request may hold meanwhile (``lock_file`` checks it)."""
    return sorted(p.name for p in out.parent.iterdir()
                  if p.name.startswith(out.name + ".") and p.name != out.name + ".lock")


def lock_file(out: Path) -> Path:
    return out.with_name(out.name + ".lock")


def cli_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "CKPTFLOW_PROGRESS": "0", **extra}


def cli_args(source: Path | str, base: Path, out: Path, *more: str) -> list[str]:
    flag = "--artifact-uri" if "://" in str(source) else "--ckpt-dir"
    return ["materialize", flag, str(source), "--base", str(base), "--out", str(out),
            "--min-tensors", str(MIN), "--max-shard-size", str(SHARD_CAP), *more]



# --unified-chat-template: a processor template whose branch with tools renders the reasoning untrimmed and
# whose branch without tools strips only newlines, so the two requests render two reasoning forms.
PROCESSOR_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' and message.get('reasoning_content') %}"
    "{%- if tools %}{{- '<think>\\n' + message['reasoning_content'] + '\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' + message['reasoning_content'].strip('\\n') + '\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def unified_base(vlm_base: Path, dst: Path) -> Path:
    """A copy of the tiny VLM base as a base --unified-chat-template supports: its templates in the two JSON
    files only (tokenizer_config.json gets the tokenizer's template, chat_template.json ``PROCESSOR_TEMPLATE``),
    no chat_template.jinja and no additional_chat_templates/ (a loader would prefer those)."""
    import json

    copy_tree(vlm_base, dst)
    (dst / "chat_template.jinja").unlink()
    shutil.rmtree(dst / "additional_chat_templates")
    config = json.loads((dst / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = tm.CHAT_TEMPLATE
    (dst / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                                               encoding="utf-8")
    (dst / "chat_template.json").write_text(json.dumps({"chat_template": PROCESSOR_TEMPLATE}, indent=2) + "\n",
                                            encoding="utf-8")
    return dst
