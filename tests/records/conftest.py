"""Parametrize record tests over every record kind, and keep probe records out of the user's cache.

A test that takes ``spec`` runs once per JSON record; ``inventory_spec`` once per record holding a file
inventory; ``any_file_spec`` also covers the verbatim legacy manifest.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from records_samples import LEGACY_MANIFEST, SPECS


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    groups = {
        "spec": SPECS,
        "inventory_spec": [s for s in SPECS if s.inventory],
        "any_file_spec": [*SPECS, LEGACY_MANIFEST],
    }
    for fixture, specs in groups.items():
        if fixture in metafunc.fixturenames:
            metafunc.parametrize(fixture, specs, ids=[s.name for s in specs])


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe records go to a per-test cache, never the user's ~/.cache."""
    monkeypatch.setenv("CKPTFLOW_CACHE_DIR", str(tmp_path / "cache"))
