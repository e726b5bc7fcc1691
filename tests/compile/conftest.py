from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

WritePack = Callable[..., Path]


@pytest.fixture
def write_pack(tmp_path: Path) -> WritePack:
    """Write a manifest (dedented) and optional extra files; return the manifest path."""

    def write(text: str, name: str = "pack.toml", **files: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
        for fname, content in files.items():
            (tmp_path / fname.replace("__", ".")).write_text(
                textwrap.dedent(content).lstrip("\n"), encoding="utf-8"
            )
        return path

    return write
