"""Session fixtures for the conversion tests (see conversion_helpers.TinyModels)."""

from __future__ import annotations

import pytest
from conversion_helpers import TinyModels


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Tiny bases, checkpoints and exports, each built once per session on first use."""
    return TinyModels(tmp_path_factory.mktemp("tiny-models"))
