"""Consolidated checkpoint -> Hugging Face model directory: conversion and verification (no CLI).

Modules: ``hf`` (``convert_checkpoint``), ``verify`` (``verify_output``), ``layout`` (key names and MoE
expert forms, shared with ``merge/``), ``shards`` (safetensors headers, shard writing, the index),
``sidecars`` (the base's non-weight files), ``source`` (reading ``model.pt`` and the base).
"""

from .hf import CONVERSION_VERSION, ConversionResult, convert_checkpoint
from .verify import DEFAULT_MIN_TENSORS, VerificationSummary, verify_output

__all__ = [
    "CONVERSION_VERSION",
    "DEFAULT_MIN_TENSORS",
    "ConversionResult",
    "VerificationSummary",
    "convert_checkpoint",
    "verify_output",
]
