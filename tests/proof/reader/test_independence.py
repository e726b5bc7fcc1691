"""The reader shares only crucible.core and the layout constants with the writer."""

from __future__ import annotations

import ast
from pathlib import Path

READER = Path(__file__).resolve().parents[3] / "tools" / "proof" / "reader"
ALLOWED = ("crucible.core", "crucible.proof.layout", "crucible.proof.reader")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "crucible.proof":
                names.extend(f"crucible.proof.{a.name}" for a in node.names)
            else:
                names.append(node.module)
    return names


def test_reader_imports_no_writer_code() -> None:
    files = sorted(READER.glob("*.py"))
    assert files
    for path in files:
        for name in _imports(path):
            if name.startswith("crucible") and name != "crucible":
                assert name.startswith(ALLOWED), f"{path.name} imports {name}"
