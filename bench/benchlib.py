"""Shared pieces of the transfer benchmarks: random payload files and a raw boto3 peer client."""

from __future__ import annotations

import os
from pathlib import Path

import boto3

MiB = 1024 * 1024


def write_random(path: Path, size: int) -> None:
    """``size`` random bytes (incompressible, so no store can shortcut them)."""
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(left, 64 * MiB)
            fh.write(os.urandom(n))
            left -= n


def raw_client(creds, config):
    """The peer: a plain boto3 client with the same endpoint, keys and botocore config as ckptflow's."""
    return boto3.client(
        "s3",
        aws_access_key_id=creds.aws_access_key_id,
        aws_secret_access_key=creds.aws_secret_access_key,
        endpoint_url=creds.endpoint_url,
        region_name=creds.region_name or "us-east-1",
        config=config,
    )
