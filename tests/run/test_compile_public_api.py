"""The dispatcher uses the compiler through its public API (crucible.compile),
never a private module of it: what the two share has one owner and one name
(issue 31, "One owner for each contract")."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import crucible.compile

RUN = Path(__file__).resolve().parents[2] / "tools" / "run"
MODULES = sorted(p for p in RUN.rglob("*.py") if "__pycache__" not in p.parts)


def _compile_imports(path: Path) -> list[tuple[int, str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("crucible.compile"):
            out.append((node.lineno, node.module or "", [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend(
                (node.lineno, a.name, [])
                for a in node.names
                if a.name.startswith("crucible.compile.")
            )
    return out


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(RUN)) for p in MODULES])
def test_run_imports_only_the_public_compile_api(path: Path) -> None:
    for line, module, names in _compile_imports(path):
        where = f"{path.relative_to(RUN)}:{line}"
        assert module == "crucible.compile", f"{where}: imports the private {module}"
        for name in names:
            assert name in crucible.compile.__all__, f"{where}: {name} is not public API"


def test_every_public_name_loads() -> None:
    for name in crucible.compile.__all__:
        assert getattr(crucible.compile, name) is not None, name
