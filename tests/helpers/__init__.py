"""Shared test helpers: the real CLI in a subprocess (``cli``), tree snapshots (``trees``), sealed sample
artifacts (``artifacts``), tiny real models (``tiny_models``), the loopback servers (``servers``),
memory sampling (``memory``), moto with real bodies (``moto_bodies``) and small tmpfs disks (``disks``)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
