"""ckptflow: safe life-cycle management for post-training checkpoint artifacts."""

__version__ = "0.1.0"
