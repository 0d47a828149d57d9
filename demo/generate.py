"""Load a materialized teacher with transformers, as a distillation job would, and print one greedy generation.

    python demo/generate.py TEACHER_DIR [PROMPT]

Loads the tokenizer and ``AutoModelForCausalLM`` from TEACHER_DIR offline, refuses a load that left any
weight missing, unexpected or mismatched (transformers only warns and random-initialises those), and
prints the prompt with its greedy continuation (at most 32 new tokens, up to the end-of-turn token).
Exits 1 when the teacher does not load cleanly.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DEFAULT_PROMPT = "the merged teacher"


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    teacher, prompt = argv[0], argv[1] if len(argv) == 2 else DEFAULT_PROMPT
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    model, info = AutoModelForCausalLM.from_pretrained(teacher, dtype=torch.bfloat16, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        print(f"generate: the teacher in {teacher} did not load cleanly: {bad}; rebuild it with materialize --force",
              file=sys.stderr)
        return 1
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.eval().generate(ids, max_new_tokens=32, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                                    pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    params = sum(p.numel() for p in model.parameters())
    print(f"  model:      {type(model).__name__}, {params:,} parameters, {model.config.num_experts} experts")
    print(f"  prompt:     {prompt!r}")
    print(f"  greedy:     {prompt!r} + {text!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
