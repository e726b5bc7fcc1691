"""Issue 32 items 1-3 through real ``crucible-dispatch`` runs: a fan-out over a
fan-out, element and member references, run results computed from several tasks."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest

from crucible.compile._fanout import MAX_INSTANCES
from tests.run.dispatchtests import DISPATCH

#: a command that writes $OUT (a JSON text in the env) as its output
EMIT = 'env = ["OUT"]\nrun = \'printf %s "$OUT" > "$CRUCIBLE_OUTPUT"\'\n'
#: each instance emits its item as v
ECHO = (
    'run = \'printf "{\\"v\\": %s}" "$(cat "$CRUCIBLE_INPUTS_DIR/item")" > "$CRUCIBLE_OUTPUT"\'\n'
)


def dispatch(tmp_path: Path, toml: str, *args: str) -> subprocess.CompletedProcess[str]:
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent(toml).lstrip())
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / "state"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def record(state: Path, task: str, key: str | None = None) -> dict[str, Any]:
    from crucible import stage

    rec = stage.load_result(state, task, key)
    assert rec is not None, (task, key)
    return rec


def fold(state: Path, task: str) -> dict[str, Any]:
    """key -> v of each instance, in item order."""
    return {
        k: record(state, task, k).get("output", {}).get("v") for k in record(state, task)["keys"]
    }


GEN = (
    """
edition = 4
[workflow]
name = "agg"
[[workflow.task]]
name = "gen"
map = [[1, 2], [3], 4, []]
emits = { v = "any" }
"""
    + ECHO
)


def test_a_map_over_a_mapped_task_flattens_in_item_then_element_order(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        GEN
        + '[[workflow.task]]\nname = "each"\nneeds = ["gen"]\nmap = "gen.v"\nemits = { v = "any" }\n'
        + ECHO,
    )
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    # gen/0 -> [1, 2], gen/1 -> [3], gen/2 -> 4 (not an array: one instance), gen/3 -> []
    assert fold(state, "each") == {"0/0": 1, "0/1": 2, "1/0": 3, "2": 4}


def test_key_field_names_the_instances(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "agg"
        [[workflow.task]]
        name = "gen"
        map = [[{ id = "a" }, { id = "b" }], [{ id = "c" }]]
        emits = { v = "any" }
        """
        + ECHO
        + '[[workflow.task]]\nname = "each"\nneeds = ["gen"]\nmap = "gen.v"\nkey = "id"\n'
        + 'emits = { v = "any" }\n'
        + ECHO,
    )
    assert proc.returncode == 0, proc.stderr
    assert list(fold(tmp_path / "state", "each")) == ["a", "b", "c"]


GATE = (
    """
edition = 4
[workflow]
name = "gate"
[[workflow.task]]
name = "gen"
map = [[1, 2], [3], [5]]
emits = { v = "any" }
when = "item != [3]"
"""
    + ECHO
)


@pytest.mark.parametrize(
    ("join", "expected"), [("all", None), ("settled", {"0/0": 1, "0/1": 2, "2/0": 5})]
)
def test_a_skipped_instance_skips_the_map_under_all_and_drops_out_under_settled(
    tmp_path: Path, join: str, expected: dict[str, int] | None
) -> None:
    proc = dispatch(
        tmp_path,
        GATE
        + f'[[workflow.task]]\nname = "each"\nneeds = ["gen"]\nmap = "gen.v"\njoin = "{join}"\n'
        + 'emits = { v = "any" }\n'
        + ECHO,
    )
    state = tmp_path / "state"
    rec = record(state, "each")
    if expected is None:
        assert rec["status"] == "skipped", rec
        assert rec["note"].startswith(
            "skipped: map gen.v reads instance '1' of 'gen', which was skipped"
        )
        assert proc.returncode == 0, proc.stderr  # IR v3: a skip is no failure
    else:
        assert proc.returncode == 0, proc.stderr
        assert fold(state, "each") == expected


def test_a_matrix_axis_reads_a_mapped_fold(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        GEN
        + '[[workflow.task]]\nname = "grid"\nneeds = ["gen"]\n'
        + 'matrix = { n = "gen.v", s = ["x"] }\nemits = { v = "any" }\n'
        + ECHO,
    )
    assert proc.returncode == 0, proc.stderr
    values = list(fold(tmp_path / "state", "grid").values())
    assert values == [
        {"n": 1, "s": "x"},
        {"n": 2, "s": "x"},
        {"n": 3, "s": "x"},
        {"n": 4, "s": "x"},
    ]


def test_more_than_the_bound_is_refused_in_one_line_with_nothing_started(tmp_path: Path) -> None:
    half = MAX_INSTANCES // 2 + 1
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "big"
        [[workflow.task]]
        name = "gen"
        map = [1, 2]
        emits = {{ v = "array" }}
        run = 'python3 -c "import json,os; json.dump({{\\"v\\": list(range({half}))}}, open(os.environ[\\"CRUCIBLE_OUTPUT\\"], \\"w\\"))"'
        [[workflow.task]]
        name = "each"
        needs = ["gen"]
        map = "gen.v"
        run = "true"
        """,
        "--emit-cap",
        "10000000",
    )
    assert proc.returncode == 1
    state = tmp_path / "state"
    rec = record(state, "each")
    assert rec["status"] == "failed"
    assert rec["note"] == (
        f"cannot expand the fan-out: map gen.v has {2 * half:,} items over 2 instances, "
        f"more than {MAX_INSTANCES:,}"
    )
    events = [json.loads(x) for x in (state / "session.jsonl").read_text().splitlines()]
    assert not [e for e in events if e["event"] == "task_started" and e["task"] == "each"]


REFS = (
    """
edition = 4
[workflow]
name = "refs"
[workflow.outputs]
first = "gen.items[0]"
region = "gen.config.region"
missing = "gen.items[3]"
[[workflow.task]]
name = "gen"
emits = { items = "array", config = "object" }
"""
    + EMIT
)


def test_element_and_member_inputs_and_outputs(tmp_path: Path) -> None:
    body = (
        REFS
        + textwrap.dedent(
            """
        [[workflow.task]]
        name = "use"
        needs = ["gen"]
        inputs = { first = "gen.items[1]", region = "gen.config.region" }
        when = "inputs.region == 'eu'"
        emits = { v = "array" }
        run = 'printf "{\\"v\\": [%s, %s]}" "$(cat "$CRUCIBLE_INPUTS_DIR/first")" "$(cat "$CRUCIBLE_INPUTS_DIR/region")" > "$CRUCIBLE_OUTPUT"'
        [[workflow.task]]
        name = "each"
        needs = ["gen"]
        map = "gen.config.zones"
        emits = { v = "any" }
        """
        )
        + ECHO
    )
    out = '{"items": ["x", "y"], "config": {"region": "eu", "zones": ["a", "b"]}}'
    pack = tmp_path / "pack.toml"
    pack.write_text(body)
    proc = subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "OUT": out},
    )
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    assert record(state, "use")["output"] == {"v": ["y", "eu"]}
    assert fold(state, "each") == {"0": "a", "1": "b"}
    doc = json.loads((state / "outputs.json").read_bytes())
    assert (doc["first"], doc["region"]) == ("x", "eu")
    assert doc["@absent"]["missing"] == {
        "reason": "missing",
        "note": "gen.items[3]: index out of range (2 items)",
    }


def test_a_missing_element_fails_the_consumer(tmp_path: Path) -> None:
    body = REFS + textwrap.dedent(
        """
        [[workflow.task]]
        name = "use"
        needs = ["gen"]
        inputs = { third = "gen.items[3]" }
        run = "true"
        """
    )
    pack = tmp_path / "pack.toml"
    pack.write_text(body)
    proc = subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / "state")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "OUT": '{"items": [1, 2], "config": {}}'},
    )
    assert proc.returncode == 1
    rec = record(tmp_path / "state", "use")
    assert rec["status"] == "failed"
    assert "input 'third': gen.items[3]: index out of range (2 items)" in rec["note"], rec


def test_computed_results(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "calc"
        [workflow.params.sep]
        type = "string"
        default = "-"
        [workflow.outputs]
        sum = "tasks.a.x + tasks.b.y"
        label = "'%s%s%s' % (tasks.a.x, params.sep, tasks.b.y)"
        n = "len(tasks.m.v)"
        fold = "m.v"
        pick = "tasks.heads.v if tasks.flip.v == 'heads' else tasks.tails.v"
        bad = "tasks.a.x + 'text'"
        gone = "tasks.off.v * 2"
        [[workflow.task]]
        name = "a"
        emits = { x = "integer" }
        run = 'printf "{\\"x\\": 2}" > "$CRUCIBLE_OUTPUT"'
        [[workflow.task]]
        name = "b"
        emits = { y = "integer" }
        run = 'printf "{\\"y\\": 40}" > "$CRUCIBLE_OUTPUT"'
        [[workflow.task]]
        name = "m"
        map = [3, 1, 2]
        emits = { v = "any" }
        """
        + ECHO
        + """
        [[workflow.task]]
        name = "flip"
        emits = { v = "string" }
        run = 'printf "{\\"v\\": \\"tails\\"}" > "$CRUCIBLE_OUTPUT"'
        [[workflow.task]]
        name = "heads"
        emits = { v = "string" }
        run = 'printf "{\\"v\\": \\"H\\"}" > "$CRUCIBLE_OUTPUT"'
        [[workflow.task]]
        name = "tails"
        emits = { v = "string" }
        run = 'printf "{\\"v\\": \\"T\\"}" > "$CRUCIBLE_OUTPUT"'
        [[workflow.task]]
        name = "off"
        when = "False"
        emits = { v = "integer" }
        run = "true"
        """,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "state" / "outputs.json").read_bytes())
    assert doc["sum"] == 42
    assert doc["label"] == "2-40"
    assert doc["n"] == 3
    assert doc["fold"] == [3, 1, 2]
    assert doc["pick"] == "T"
    assert doc["@absent"]["bad"]["reason"] == "error"
    assert "tasks.a.x + 'text'" in doc["@absent"]["bad"]["note"]
    assert doc["@absent"]["gone"]["reason"] == "skipped"
    assert doc["@from"]["sum"] == {"expression": "tasks.a.x + tasks.b.y"}


def test_a_runaway_result_expression_is_stopped_by_the_when_bounds(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "slow"
        [workflow.outputs]
        spin = "len([1 for i in range(tasks.a.x) for j in range(tasks.a.x) if False])"
        hog = "len('x' * (tasks.a.x * 20000))"
        [[workflow.task]]
        name = "a"
        emits = { x = "integer" }
        run = 'printf "{\\"x\\": 100000}" > "$CRUCIBLE_OUTPUT"'
        """,
    )
    assert proc.returncode == 0, proc.stderr  # the run passed; the result is absent
    doc = json.loads((tmp_path / "state" / "outputs.json").read_bytes())
    why = doc["@absent"]["spin"]
    assert why["reason"] == "error"
    assert "longer than 2 s" in why["note"], why
    why = doc["@absent"]["hog"]
    assert why["reason"] == "error"
    assert "memory" in why["note"], why
    assert "2 of 2 declared outputs are absent" in proc.stderr


def test_fold_pairs_flatten_and_bound_in_the_library() -> None:
    from crucible.run.engine._folds import Fold, FoldProblem, FoldSkipped, fold_pairs, read_fold

    fold = Fold([("a", [1, 2]), ("b", {"k": 1}), ("c", [])])
    assert fold_pairs(fold, "map gen.v") == [("a/0", 1), ("a/1", 2), ("b", {"k": 1})]
    big = Fold([("0", list(range(MAX_INSTANCES))), ("1", [0])])
    with pytest.raises(FoldProblem) as refused:
        fold_pairs(big, "matrix axis 'n' gen.v")
    assert refused.value.message == (
        f"matrix axis 'n' gen.v has {MAX_INSTANCES + 1:,} items over 2 instances, "
        f"more than {MAX_INSTANCES:,}"
    )
    records: dict[str, dict[str, Any]] = {
        "0": {"status": "passed", "output": {"v": [1]}},
        "1": {"status": "failed"},
        "2": {"status": "passed", "output": {"v": [2]}},
    }
    keys = ["0", "1", "2"]
    kept = read_fold(records, keys, "gen", "v", settled=True, what="map gen.v")
    assert kept == [("0", [1]), ("2", [2])]
    with pytest.raises(
        FoldSkipped, match=r"^skipped: map gen\.v reads instance '1' of 'gen', which failed"
    ):
        read_fold(records, keys, "gen", "v", settled=False, what="map gen.v")
