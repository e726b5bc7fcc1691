"""Every diagnostic code the compiler can emit is in the spec's table, and vice versa."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def emitted_codes() -> set[str]:
    codes: set[str] = set()
    # the task-name rule lives in core/contract.py, shared with stage
    sources = [*(REPO / "tools" / "compile").glob("*.py"), REPO / "tools" / "core" / "contract.py"]
    for path in sources:
        text = path.read_text()
        codes |= set(
            re.findall(r'(?:chk\.error|_refuse|Diagnostic)\(\s*(?:state,\s*)?"([a-z0-9-]+)"', text)
        )
        codes |= set(re.findall(r'"(name-[a-z-]+)"', text))
        codes |= {f"{p}-{s}" for p in ("map", "input") for s in ("not-dependency", "unknown-field")}
    return codes


def documented_codes() -> set[str]:
    table = (REPO / "docs" / "spec" / "plan-ir.md").read_text().split("## Validation codes", 1)[1]
    codes: set[str] = set()
    for line in table.splitlines():
        if line.startswith("| `"):
            first_cell = line.split("|")[1]
            codes |= set(re.findall(r"`([a-z0-9-]+)`", first_cell))
    return codes


def test_every_emitted_code_is_documented() -> None:
    emitted = emitted_codes()
    assert len(emitted) > 30
    assert emitted - documented_codes() == set()


def test_every_documented_code_exists() -> None:
    raised = {"unsupported-version", "parse", "canonical-json", "usage"}  # core exceptions
    assert documented_codes() - emitted_codes() - raised == set()
