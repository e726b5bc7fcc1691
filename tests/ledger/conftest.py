from __future__ import annotations

from pathlib import Path

import pytest


class Warnings(list[str]):
    """Collects what a Ledger reports instead of writing it to stderr."""

    def __call__(self, message: str) -> None:
        self.append(message)


@pytest.fixture
def warnings() -> Warnings:
    return Warnings()


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ledger"
    d.mkdir()
    return d
