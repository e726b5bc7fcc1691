"""A condition on an instance of a listed fan-out (a literal map, a matrix) reads
its own item: the two edition-4 features meet in the dispatcher's expansion."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.run.dispatchtests import DISPATCH

PACK = """edition = 4

[workflow]
name = "cf"

[[workflow.task]]
name = "each"
map = [{ name = "a", go = true }, { name = "b", go = false }, { name = "c", go = true }]
key = "name"
when = "item.go"
run = 'true'

[[workflow.task]]
name = "grid"
matrix = { os = ["linux", "mac"], py = ["3.11", "3.12"] }
when = "item.os == 'linux' or item.py == '3.12'"
run = 'true'
"""


def test_conditions_read_items_of_literal_maps_and_matrices(tmp_path: Path) -> None:
    (tmp_path / "pack.toml").write_text(PACK)
    state = tmp_path / "s"
    proc = subprocess.run(
        [DISPATCH, str(tmp_path / "pack.toml"), "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr

    def rows(task: str) -> list[dict[str, str]]:
        out = subprocess.run(
            [DISPATCH, "report", str(state), task, "--json"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
        return [r for r in map(json.loads, out.splitlines()) if r.get("key") is not None]

    each = {r["key"]: r["status"] for r in rows("each")}
    assert each == {"a": "passed", "b": "skipped", "c": "passed"}
    grid = sorted(r["status"] for r in rows("grid"))
    assert grid == ["passed", "passed", "passed", "skipped"]
