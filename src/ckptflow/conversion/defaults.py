"""Defaults of the conversion that torch-free callers (the CLI's parsers, materialize deciding whether a
completed output can be kept) read without loading torch."""

DEFAULT_MIN_TENSORS = 800  # the tensor floor of verify_output and materialize (--min-tensors)
# The conversion's version, part of every teacher's identity: bump it when the bytes a build writes change.
CONVERSION_VERSION = "materialize_model_pt_to_hf/3"
