from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


def write_pack_text(root: Path, body: str, *, edition: int = 3, name: str = "t") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "pack.toml"
    path.write_text(f'edition = {edition}\n\n[workflow]\nname = "{name}"\n\n{body}')
    return path


@pytest.fixture
def pack(tmp_path: Path) -> Callable[..., Path]:
    def make(body: str, *, edition: int = 3, name: str = "t", where: str = "pack") -> Path:
        return write_pack_text(tmp_path / where, body, edition=edition, name=name)

    return make
