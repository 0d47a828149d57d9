"""Streaming expert merge: ``avg`` and ``tv`` (task vector), diagnostics, request identity.

``merge_experts`` (``run.py``) is the entry point ``ckptflow merge`` calls; ``layout`` normalises
key layouts, ``reader`` maps inputs, ``methods`` holds the arithmetic, ``writer`` the incremental
``torch.save`` writer, ``build`` the plan and the streamed write, ``identity`` the skip/build/refuse
rules, ``diagnostics`` the per-tensor delta statistics.
"""

from .run import MergeResult, merge_experts

__all__ = ["MergeResult", "merge_experts"]
