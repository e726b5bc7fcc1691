"""Which package may import which (../shared/DESIGN.md, "Layout").

crucible.core imports no tool; a tool imports core and itself, not another tool,
except run, which composes compile, stage and ledger; the proof reader reaches
its verdicts from the bundle alone, sharing only core and the layout constants
with the writer. Every import counts, the lazy ones inside functions too.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
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


def _comment_lines(source: str) -> set[int]:
    """Lines holding a comment that says something (not only a tool's pragma)."""
    found: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        text = tok.string.lstrip("#").strip()
        if tok.type == tokenize.COMMENT and text and not text.startswith(PRAGMAS):
            found.add(tok.start[0])
    return found


#: comments that are a tool's, not a reason
PRAGMAS = ("noqa", "type:", "pragma", "fmt:")


def _import_runs(fn: ast.AST) -> list[list[ast.stmt]]:
    """Runs of adjacent import statements in each statement list inside ``fn``."""
    runs: list[list[ast.stmt]] = []
    for node in ast.walk(fn):
        for name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, name, None)
            if not isinstance(stmts, list):
                continue
            run: list[ast.stmt] = []
            for s in stmts:
                if not isinstance(s, (ast.Import, ast.ImportFrom)):
                    run = []
                    continue
                end = run[-1].end_lineno if run else None
                if run and end is not None and s.lineno == end + 1:
                    run.append(s)
                else:
                    run = [s]
                    runs.append(run)
    return runs


def unexplained_imports(path: Path) -> list[str]:
    """Function-level imports with no comment saying why: on one of their lines,
    or on the line just above the run of imports they belong to."""
    source = path.read_text()
    comments = _comment_lines(source)
    found: list[str] = []
    seen: set[int] = set()
    for fn in ast.walk(ast.parse(source, str(path))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for run in _import_runs(fn):
            first, last = run[0].lineno, run[-1].end_lineno or run[-1].lineno
            if first in seen:
                continue
            seen.add(first)
            if not comments.intersection(range(first - 1, last + 1)):
                found.append(f"{path.relative_to(TOOLS.parent)}:{first}: in {fn.name}()")
    return found


def test_function_level_imports_say_why() -> None:
    """An import inside a function says why it is there and not at the top
    (start-up: a heavy or rarely needed module; or another reason): a
    comment on it, or on the line above its run of imports (docs/ARCHITECTURE.md)."""
    assert [
        line for p in [*MODULES, TOOLS / "__init__.py"] for line in unexplained_imports(p)
    ] == []


def test_an_unexplained_function_level_import_is_found(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    module = tools / "m.py"
    module.write_text(
        "def f():\n"
        "    import json  # noqa: F401\n"
        "\n"
        "def g():\n"
        "    # lazy: only g needs them\n"
        "    import json\n"
        "    import os\n"
        "\n"
        "    import sys  # lazy: a reason\n"
        "    import re\n"
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sys.modules[__name__], "TOOLS", tools)
        assert unexplained_imports(module) == ["tools/m.py:2: in f()"]
