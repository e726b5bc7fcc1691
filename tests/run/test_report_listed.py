"""Issue 27 item 20: the report and ``-n`` of listed fan-outs and cached and
failed instances. A listed fan-out (``map = { count = 4 }``) interrupted during
instance 0 was reported as ``1 instances: 1 interrupted`` with only ``t[0]``
listed, and ``-n`` then called ``t[0]`` "new" and left out the other
instances; a mapped task whose instances were all cache hits showed OUTPUT
``0 B`` and was not marked cached; ``index.json`` said ``files_staged: true`` for
a failed instance that captured nothing."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from tests.run.dispatchtests import DISPATCH, Gate, reaped, start_dispatch, wait_files, write_pack


def crucible(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DISPATCH, *map(str, args)], capture_output=True, text=True, timeout=120)


def test_a_listed_fanout_interrupted_in_instance_0_shows_every_instance(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    state = tmp_path / "state"
    with Gate(tmp_path / "gate") as gate:
        pack = write_pack(
            tmp_path,
            'edition = 4\n[workflow]\nname = "listed"\n[[workflow.task]]\nname = "t"\n'
            "map = { count = 4 }\n"
            f'run = \'echo > {marks}/$CRUCIBLE_KEY; {gate.wait}; echo "{{}}" > "$CRUCIBLE_OUTPUT"\'\n',
        )
        with reaped(start_dispatch(pack, state, "-j", "1")) as proc:
            wait_files(marks, "0", 1)
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 130
    table = crucible("report", state).stdout
    assert "4 instances: 1 interrupted, 3 not started" in table
    rows = [
        json.loads(line) for line in crucible("report", state, "t", "--json").stdout.splitlines()
    ]
    assert [(r.get("key"), r["status"]) for r in rows] == [
        (None, "interrupted"),
        ("0", "interrupted"),
        ("1", "pending"),
        ("2", "pending"),
        ("3", "pending"),
    ]
    dry = crucible(pack, "--state", state, "--resume", "-n", "--all").stdout.splitlines()[1:]
    assert [line.split()[1:3] for line in dry] == [
        ["t[0]", "unsettled"],
        ["t[1]", "new"],
        ["t[2]", "new"],
        ["t[3]", "new"],
    ]


def test_a_mapped_task_all_cache_hits_is_cached_with_its_output_size(tmp_path: Path) -> None:
    pack = write_pack(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "cached"
        [[workflow.task]]
        name = "t"
        map = { count = 3 }
        run = 'echo "{\\"v\\": $CRUCIBLE_KEY}" > "$CRUCIBLE_OUTPUT"'
        """,
    )
    cache = tmp_path / "cache"
    cache.mkdir()
    assert crucible(pack, "--state", tmp_path / "one", "--cache", cache).returncode == 0
    assert crucible(pack, "--state", tmp_path / "two", "--cache", cache).returncode == 0
    (row,) = [
        json.loads(line)
        for line in crucible("report", tmp_path / "two", "--json").stdout.splitlines()
        if json.loads(line).get("key") is None
    ]
    assert row["status"] == "passed" and row.get("cached") is True
    assert row["output_bytes"] == 3 * len(b'{"v":0}')  # each hit's recorded output
    table = crucible("report", tmp_path / "two").stdout
    (line,) = [x for x in table.splitlines() if x.startswith("t ")]
    # TASK, STATUS "passed (cached)", ATTEMPTS, DURATION, then OUTPUT "21 B"
    assert "passed (cached)" in line and line.split()[5:7] == ["21", "B"], line


def test_a_failed_instance_that_captured_nothing_stages_no_files(tmp_path: Path) -> None:
    index = tmp_path / "index.json"
    pack = write_pack(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "staged"
        [[workflow.task]]
        name = "p"
        map = {{ count = 2 }}
        emits = {{ n = "integer" }}
        emits_files = ["out.txt"]
        run = 'if [ "$CRUCIBLE_KEY" = 1 ]; then exit 3; fi; echo hi > out.txt; echo "{{\\"n\\": 1}}" > "$CRUCIBLE_OUTPUT"'
        [[workflow.task]]
        name = "c"
        needs = ["p"]
        join = "settled"
        inputs = {{ ns = "p.n" }}
        run = 'cp "$CRUCIBLE_INPUTS_DIR/index.json" {index}; echo "{{}}" > "$CRUCIBLE_OUTPUT"'
        """,
    )
    assert crucible(pack, "--state", tmp_path / "state").returncode == 1
    (fold,) = [e for e in json.loads(index.read_text())["inputs"] if e["name"] == "ns"]
    staged = {e["key"]: (e["status"], e["files_staged"]) for e in fold["entries"]}
    assert staged == {"0": ("passed", True), "1": ("failed", False)}
    assert fold["files_staged"] is True  # instance 0's
