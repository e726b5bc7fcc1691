"""Every document a module of tools/ cites exists (a docstring cited a CONTRACT.md
that was never written: issue 11 item 7)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the design brief lives beside the repository (../shared/DESIGN.md), not in it
OUTSIDE = frozenset({"DESIGN.md"})
_CITED = re.compile(r"(?<![\w./-])([\w./-]+\.md)\b")


def cited(text: str) -> set[str]:
    return set(_CITED.findall(text))


def resolves(name: str) -> bool:
    if name in OUTSIDE:
        return True
    # a bare name (``run.md``) is a spec of docs/spec/, as the specs cite each other
    return any((root / name).is_file() for root in (REPO, REPO / "docs", REPO / "docs/spec"))


def test_every_cited_document_exists() -> None:
    missing = sorted(
        f"{path.relative_to(REPO)}: {name}"
        for path in (REPO / "tools").rglob("*.py")
        for name in cited(path.read_text())
        if not resolves(name)
    )
    assert missing == []


def test_a_missing_document_is_found() -> None:
    assert cited("Public API (docs/spec/plan-ir.md, CONTRACT.md):") == {
        "docs/spec/plan-ir.md",
        "CONTRACT.md",
    }
    assert not resolves("CONTRACT.md") and resolves("docs/spec/plan-ir.md")
    assert resolves("run.md") and resolves("docs/run-on-a-cluster.md")
