"""Which package may import which (../shared/DESIGN.md, "Layout").

crucible.core imports no tool; a tool imports core and itself, not another tool,
except run, which composes compile, stage and ledger; the proof reader reaches
its verdicts from the bundle alone, sharing only core and the layout constants
with the writer. Every import counts, the lazy ones inside functions too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "tools"

#: package -> the crucible packages it may import (besides itself and crucible)
ALLOWED: dict[str, tuple[str, ...]] = {
    "crucible.core": (),
    "crucible.compile": ("crucible.core",),
    "crucible.stage": ("crucible.core",),
    "crucible.ledger": ("crucible.core",),
    "crucible.run": ("crucible.core", "crucible.compile", "crucible.stage", "crucible.ledger"),
    "crucible.proof.writer": ("crucible.core", "crucible.proof.layout"),
    "crucible.proof.reader": ("crucible.core", "crucible.proof.layout"),
    "crucible.proof": ("crucible.core",),
}


def package_of(path: Path) -> str:
    rel = path.relative_to(TOOLS).with_suffix("")
    parts = ["crucible", *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    module = ".".join(parts)
    # the most specific package named in ALLOWED that holds this module
    return max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len)


def imports(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in ("crucible", "crucible.proof"):
                found.extend((node.lineno, f"{node.module}.{a.name}") for a in node.names)
            else:
                found.append((node.lineno, node.module))
    return found


MODULES = sorted(
    p for p in TOOLS.rglob("*.py") if p.parent != TOOLS and "__pycache__" not in p.parts
)


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(TOOLS)) for p in MODULES])
def test_imports_respect_the_layers(path: Path) -> None:
    own = package_of(path)
    allowed = (own, *ALLOWED[own])
    for line, name in imports(path):
        if not name.startswith("crucible.") or name == "crucible.__version__":
            continue
        assert any(name == a or name.startswith(a + ".") for a in allowed), (
            f"{path.relative_to(TOOLS)}:{line}: {own} imports {name}"
        )


def test_every_package_is_covered() -> None:
    packages = {package_of(p) for p in MODULES}
    assert {"crucible.core", "crucible.run", "crucible.proof.reader"} <= packages
