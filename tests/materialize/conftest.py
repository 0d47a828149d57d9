"""Session fixtures for the materialize tests (see materialize_helpers.Models)."""

from __future__ import annotations

import pytest
from materialize_helpers import Models


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Models:
    """Tiny bases and sealed artifacts, each built once per session on first use."""
    return Models(tmp_path_factory.mktemp("materialize-models"))
