"""The longest legal task name runs end to end and the first illegal one is
refused before anything runs (issue 14; docs/spec/manifest.md, "Names"). A
task name of 250 bytes used to compile, then its fan-out failed at run time:
``results/<name>.jsonl`` is 256 bytes, over the 255-byte file-name limit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from crucible.core.contract import FILE_NAME_MAX, NAME_MAX_BYTES

BIN = Path(sys.executable).parent

#: 249 bytes of UTF-8 in 149 characters: the limit counts bytes
LONGEST = "é" * 100 + "t" * (NAME_MAX_BYTES - 200)
FIRST_ILLEGAL = LONGEST + "t"


def _tool(name: str, *args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / name), *map(str, args)], capture_output=True, text=True, timeout=120
    )


def _pack(root: Path, name: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    path = root / "pack.toml"
    path.write_text(
        f"""edition = 3

[workflow]
name = "long"

[[workflow.task]]
name = "src"
emits = {{ xs = "array" }}
run = '''printf '{{"xs": [1, 2, 3]}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "{name}"
needs = ["src"]
map = "src.xs"
emits = {{ y = "integer" }}
emits_files = ["o"]
run = '''echo hi > o; printf '{{"y": 1}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "after"
needs = ["{name}"]
run = '''test "$(cat 'inputs/{name}/2/o')" = hi'''
""",
        encoding="utf-8",
    )
    return path


def test_the_longest_legal_name_compiles_fans_out_and_reports(tmp_path: Path) -> None:
    assert len(LONGEST.encode()) == NAME_MAX_BYTES == 249
    pack = _pack(tmp_path / "pack", LONGEST)
    assert _tool("crucible-validate", pack).returncode == 0
    plan = tmp_path / "plan.json"
    compiled = _tool("crucible-compile", pack, "-o", plan)
    assert compiled.returncode == 0, compiled.stderr
    state = tmp_path / "state"
    ran = _tool("crucible-dispatch", plan, "--state", state)
    assert ran.returncode == 0, ran.stderr
    packed = state / "results" / (LONGEST + ".jsonl")
    assert len(packed.name.encode()) == FILE_NAME_MAX
    assert len(packed.read_bytes().splitlines()) == 3
    report = _tool("crucible-dispatch", "report", state, "--json")
    assert report.returncode == 0, report.stderr
    rows = {row["task"]: row for row in map(json.loads, report.stdout.splitlines())}
    assert rows[LONGEST]["status"] == "passed" and rows["after"]["status"] == "passed"
    per_instance = _tool("crucible-dispatch", "report", state, LONGEST, "--json")
    assert per_instance.returncode == 0, per_instance.stderr
    keyed = [json.loads(line) for line in per_instance.stdout.splitlines()]
    assert sorted(r["key"] for r in keyed if "key" in r) == ["0", "1", "2"]


def test_one_byte_more_is_refused_by_validate_compile_and_dispatch(tmp_path: Path) -> None:
    pack = _pack(tmp_path / "pack", FIRST_ILLEGAL)
    checked = _tool("crucible-validate", "--json", pack)
    assert checked.returncode == 1, checked.stderr
    codes = [json.loads(line)["code"] for line in checked.stdout.splitlines()]
    assert codes == ["name-too-long"]
    assert "249 bytes" in checked.stdout and "results/<task>.jsonl" in checked.stdout
    compiled = _tool("crucible-compile", pack, "-o", tmp_path / "plan.json")
    assert compiled.returncode == 1 and not (tmp_path / "plan.json").exists()
    ran = _tool("crucible-dispatch", pack, "--state", tmp_path / "state")
    assert ran.returncode == 1 and "249" in ran.stderr, ran.stderr
    assert len(ran.stderr.strip().splitlines()) <= 2  # diagnostics, never a traceback
    assert "Traceback" not in ran.stderr
    assert not (tmp_path / "state" / "results").exists()


def test_a_plan_edited_to_the_first_illegal_name_is_refused_by_dispatch(tmp_path: Path) -> None:
    """Defence in depth: a plan file that never went through compile's rule is
    refused by stage's own check (exit 1) before any unit runs."""
    pack = _pack(tmp_path / "pack", LONGEST)
    plan = tmp_path / "plan.json"
    assert _tool("crucible-compile", pack, "-o", plan).returncode == 0
    plan.write_text(plan.read_text(encoding="utf-8").replace(LONGEST, FIRST_ILLEGAL), "utf-8")
    ran = _tool("crucible-dispatch", plan, "--state", tmp_path / "state")
    assert ran.returncode == 1, ran.stderr
    assert "249" in ran.stderr and "Traceback" not in ran.stderr
    assert not (tmp_path / "state" / "results").exists()
