"""Every example pack and test pack compiles to its committed golden plan, byte for byte.

Set CRUCIBLE_UPDATE_GOLDEN=1 to rewrite the goldens (then review the diff).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.compile import compile_path, load_plan_path
from crucible.core import canon

REPO = Path(__file__).resolve().parents[2]
PACKS = sorted([*REPO.glob("examples/*/pack.toml"), *REPO.glob("tests/compile/packs/*/pack.toml")])
UPDATE = os.environ.get("CRUCIBLE_UPDATE_GOLDEN") == "1"


def test_there_are_packs() -> None:
    names = {p.parent.name for p in PACKS}
    assert {"legacy-v1", "edition2", "starlark"} <= names


@pytest.mark.parametrize("manifest", PACKS, ids=[str(p.parent.relative_to(REPO)) for p in PACKS])
def test_golden_plan(manifest: Path) -> None:
    golden = manifest.parent / "golden.plan.json"
    compiled = compile_path(manifest)
    if UPDATE:
        golden.write_bytes(compiled.data)
    assert golden.exists(), f"no golden plan for {manifest}; run with CRUCIBLE_UPDATE_GOLDEN=1"
    assert compiled.data == golden.read_bytes(), (
        f"{manifest} no longer compiles to {golden}; if the change is intended, "
        "rerun with CRUCIBLE_UPDATE_GOLDEN=1 and review the diff"
    )
    assert compiled.data == canon.dumps(compiled.plan)  # fast path == exact RFC 8785
    # the golden plan itself passes the strict plan reader, with the same digest
    assert load_plan_path(golden).digest == compiled.digest
