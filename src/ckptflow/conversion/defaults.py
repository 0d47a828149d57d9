"""Defaults of the conversion that torch-free callers (the CLI's parsers) read without loading torch."""

DEFAULT_MIN_TENSORS = 800  # the tensor floor of verify_output and materialize (--min-tensors)
