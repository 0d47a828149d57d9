"""``materialize``: build the Hugging Face teacher directory of a checkpoint artifact, staged and identified.

``materialize`` (``run.py``) is the entry point ``ckptflow materialize`` calls: the request and the decision
under the output's lock (its module doc gives the order of work and the decision table); ``source`` resolves
and opens the model.pt, ``preflight`` checks the base, ``identity`` says what an output is, ``output`` decides
on <out> and swaps a staged tree into place, ``build`` fetches, builds or recovers, ``recovery`` handles what
killed runs left, ``staging`` the fetch stage, ``lock`` the output's lock; ``hf_source`` resolves a Hugging Face
Trainer artifact and ``hf_artifact`` builds its teacher (a full fine-tune as it is, a LoRA adapter merged into
its base).
"""

from .run import MaterializeResult, materialize

__all__ = ["MaterializeResult", "materialize"]
