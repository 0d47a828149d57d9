"""Consolidated checkpoint -> Hugging Face model directory: conversion and verification (no CLI).

Modules: ``hf`` (``convert_checkpoint``), ``verify`` (``verify_output``), ``layout`` (key names and MoE
expert forms, shared with ``merge/``), ``shards`` (safetensors headers, shard writing, the index),
``sidecars`` (the base's non-weight files), ``chat_template`` (``--unified-chat-template``), ``source``
(reading ``model.pt`` and the base), ``dtypes`` (shapes and dtype names).

Reading and validating a base (``source.read_base``, ``shards``, ``sidecars``, ``chat_template``) imports no
torch, so the materialize preflight refuses a bad base before torch loads, and a request whose completed
output is kept (a skip) never loads it; the names below that need torch
(``convert_checkpoint``, ``verify_output`` …) are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .defaults import CONVERSION_VERSION, DEFAULT_MIN_TENSORS

_LAZY = {
    "ConversionResult": "hf",
    "convert_checkpoint": "hf",
    "VerificationSummary": "verify",
    "verify_output": "verify",
}

__all__ = ["CONVERSION_VERSION", "DEFAULT_MIN_TENSORS", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
