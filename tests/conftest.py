from __future__ import annotations

from pathlib import Path

import pytest

# every file the tools write during the session is checked against its schema
# at the end (tests/schemas/plugin.py)
pytest_plugins = ["tests.schemas.plugin"]

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is not present next to the repository")
    return SHARED
