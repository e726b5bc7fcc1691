"""Which package may import which (../shared/DESIGN.md, "Layout").

crucible.core imports no tool; a tool imports core and itself, not another tool,
except run, which composes compile, stage and ledger; the proof reader reaches
its verdicts from the bundle alone, sharing only core and the layout constants
with the writer. Every import counts, the lazy ones inside functions too.
"""

from __future__ import annotations

import ast
import sys
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
    # an accounted run drives the proof writer (docs/spec/export.md); run itself does not
    "crucible.run.accounting": (
        "crucible.core",
        "crucible.compile",
        "crucible.stage",
        "crucible.proof.writer",
        "crucible.proof.layout",
    ),
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


def module_of(path: Path) -> str:
    parts = ["crucible", *path.relative_to(TOOLS).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


ALL_MODULES = {module_of(p): p for p in TOOLS.rglob("*.py") if "__pycache__" not in p.parts}


def _known(name: str) -> str | None:
    """The module ``name`` loads: itself, else the nearest package holding it
    (``from crucible.stage import escape_key`` loads crucible.stage)."""
    while name and name not in ALL_MODULES:
        name = name.rpartition(".")[0]
    return name or None


def module_imports(module: str) -> set[str]:
    """Every crucible module ``module`` imports: at the top, inside functions and
    under TYPE_CHECKING alike (a circle through a lazy import is still one)."""
    path = ALL_MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(t for a in node.names if (t := _known(a.name)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package
                for _ in range(node.level - 1):
                    up = up.rpartition(".")[0]
                base = f"{up}.{base}" if base else up
            for a in node.names:
                sub = f"{base}.{a.name}"
                target = sub if sub in ALL_MODULES else _known(base)
                if target:
                    found.add(target)
    found.discard(module)
    return found


def import_circles() -> list[list[str]]:
    """The strongly connected components of the import graph with more than one
    module (Tarjan's algorithm, iterative)."""
    graph = {m: sorted(module_imports(m)) for m in sorted(ALL_MODULES)}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(graph[node]):
                work.append((node, i + 1))
                nxt = graph[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return circles


def test_no_import_circles() -> None:
    """No module reaches itself through imports, the lazy ones inside functions
    and those under TYPE_CHECKING included: each package's modules form layers
    (docs/ARCHITECTURE.md)."""
    assert import_circles() == []


def test_the_circle_finder_finds_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lazy import back up closes a circle, and the finder names it."""
    a = tmp_path / "a.py"
    b = tmp_path / "b.py"
    (tmp_path / "__init__.py").write_text("")
    a.write_text("from crucible.x.b import f\n")
    b.write_text("def f():\n    from crucible.x import a\n")
    monkeypatch.setattr(
        sys.modules[__name__],
        "ALL_MODULES",
        {"crucible.x.a": a, "crucible.x.b": b, "crucible.x": tmp_path / "__init__.py"},
    )
    assert import_circles() == [["crucible.x.a", "crucible.x.b"]]
