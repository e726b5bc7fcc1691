from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.core.cli import CHECK_EXIT_ENV

# every command a test runs checks at its fast exit that it left no file open
# (core.cli._left_open; docs/spec/run.md, "Exit")
os.environ[CHECK_EXIT_ENV] = "1"

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
