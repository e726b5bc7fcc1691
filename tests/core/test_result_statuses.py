"""A settled record's statuses have one owner (core.contract): stage writes them,
dispatch's report reads them, the schema lists them."""

from __future__ import annotations

import json
import re
from pathlib import Path

from crucible.core.contract import RESULT_STATUSES
from crucible.stage import _records

REPO = Path(__file__).resolve().parents[2]


def test_stage_the_report_and_the_schema_agree() -> None:
    assert _records.STATUSES is RESULT_STATUSES
    schema = json.loads((REPO / "docs/schemas/result-record.json").read_text())
    assert tuple(schema["properties"]["status"]["enum"]) == RESULT_STATUSES


def test_no_tool_imports_a_private_module_of_stage() -> None:
    # the report took STATUSES from stage._records; a contract value lives in core
    for path in (REPO / "tools").rglob("*.py"):
        if path.parent.name == "stage":
            continue
        found = re.findall(r"from crucible\.stage\._\w+ import", path.read_text())
        assert not found, f"{path.relative_to(REPO)}: {found}"
