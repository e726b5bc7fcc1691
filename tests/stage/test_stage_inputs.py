from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon, digest
from crucible.core.errors import InputRefused, ParseError
from crucible.stage import INPUTS_ENV_MAX, StateDir
from tests.stage.stageplans import plan, settle, task


def _readonly(path: Path) -> bool:
    return not (path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


# -- IR v1 ---------------------------------------------------------------------


def test_v1_object_has_every_direct_dependency_and_reserved_inputs(state: Path, ws: Path) -> None:
    p = plan(
        task("a", emits={"x": "integer"}),
        task("b", needs=["a"], emits={"y": "string"}),
        task("c", needs=["b"]),
        params={"who": {"type": "string", "default": "w"}},
    )
    settle(p, state, "a", {"x": 1})
    settle(p, state, "b", {"y": "s", "z": [1]})
    (state / "reserved").mkdir()
    (state / "reserved" / "history.json").write_text('[{"turn": 1}]')
    (state / "params.json").write_bytes(canon.dumps({"who": "me"}))
    staged = StateDir(p, state).stage_inputs("c", ws)
    obj = {"b": {"y": "s", "z": [1]}, "params": {"who": "me"}, "history": [{"turn": 1}]}
    assert staged.value == obj
    f = ws / "inputs" / "@inputs.json"
    assert f.read_bytes() == canon.dumps(obj) and _readonly(f)
    assert staged.env == {
        "CRUCIBLE_INPUTS_FILE": str(f),
        "CRUCIBLE_INPUTS": canon.dumps(obj).decode(),
    }
    assert not (ws / "inputs" / "@values").exists()


def test_v1_env_copy_only_while_at_most_64_kib(state: Path, ws: Path) -> None:
    p = plan(task("a", emits={"x": "string"}), task("c", needs=["a"]))
    # {"a":{"x":"..."},"params":{}} = 26 bytes of framing
    settle(p, state, "a", {"x": "q" * (INPUTS_ENV_MAX - 26)})
    staged = StateDir(p, state).stage_inputs("c", ws)
    assert len(staged.env["CRUCIBLE_INPUTS"]) == INPUTS_ENV_MAX
    settle(p, state, "a", {"x": "q" * (INPUTS_ENV_MAX - 25)})
    staged = StateDir(p, state).stage_inputs("c", ws)
    assert "CRUCIBLE_INPUTS" not in staged.env and "CRUCIBLE_INPUTS_FILE" in staged.env


def test_v1_agent_gets_no_params_and_instance_gets_item(state: Path, ws: Path) -> None:
    p = plan(
        task("src", emits={"xs": "array"}),
        task("m", "agent", needs=["src"], map="src.xs", prompt="p"),
        params={"k": {"type": "integer", "default": 1}},
    )
    settle(p, state, "src", {"xs": [{"i": 0}, {"i": 1}]})
    staged = StateDir(p, state).stage_inputs("m", ws, key="1")
    assert staged.value == {"src": {"xs": [{"i": 0}, {"i": 1}]}, "item": {"i": 1}}
    with pytest.raises(InputRefused, match="no instance"):
        StateDir(p, state).stage_inputs("m", ws, key="7")


def test_v1_fold_is_instance_outputs_in_item_order(state: Path, ws: Path) -> None:
    p = plan(
        task("src", emits={"xs": "object"}),
        task("m", needs=["src"], map="src.xs", emits={"v": "any"}),
        task("c", needs=["m"], join="settled"),
    )
    settle(p, state, "src", {"xs": {"b": 2, "a": 1}})
    settle(p, state, "m", {"v": "A"}, key="a")
    settle(p, state, "m", {"v": "B"}, key="b", exit_code=1)
    StateDir(p, state).settle_fold("m", ["a", "b"])
    staged = StateDir(p, state).stage_inputs("c", ws)
    assert staged.value is not None and staged.value["m"] == [{"v": "A"}, {"v": "B"}]


def test_v1_reserved_name_collision_is_refused(state: Path, ws: Path) -> None:
    p = plan(task("item"), task("c", needs=["item"]))
    settle(p, state, "item", None)
    with pytest.raises(InputRefused, match="collides"):
        StateDir(p, state).stage_inputs("c", ws)


# -- IR v2 ---------------------------------------------------------------------


def _index(ws: Path) -> dict[str, Any]:
    index: dict[str, Any] = json.loads((ws / "inputs" / "@values" / "index.json").read_bytes())
    return index


def test_v2_one_file_per_declared_input_and_nothing_undeclared(state: Path, ws: Path) -> None:
    p = plan(
        task("a", emits={"x": "integer", "y": "object"}),
        task("c", needs=["a"], inputs={"count": "a.x"}),
        version=2,
    )
    settle(p, state, "a", {"x": 42, "y": {"big": 1}, "undeclared": 2})
    staged = StateDir(p, state).stage_inputs("c", ws)
    values = ws / "inputs" / "@values"
    assert staged.env == {"CRUCIBLE_INPUTS_DIR": str(values)}
    assert sorted(os.listdir(values)) == ["count", "index.json", "params"]
    assert (values / "count").read_bytes() == b"42" and _readonly(values / "count")
    index = _index(ws)
    assert index == staged.index
    assert index["format"] == "crucible.inputs-index/1" and index["task"] == "c"
    count = index["inputs"][0]
    assert count == {
        "name": "count",
        "kind": "declared",
        "producer": "a",
        "field": "x",
        "type": "integer",
        "status": "passed",
        "note": "",
        "fold": False,
        "value_staged": True,
        "files_staged": False,
        "size": 2,
        "digest": digest.of_bytes(b"42"),
        "path": "inputs/@values/count",
    }
    assert index["inputs"][1]["name"] == "params" and index["inputs"][1]["kind"] == "reserved"


def test_v2_fold_directory_escaped_keys_and_index_in_item_order(state: Path, ws: Path) -> None:
    p = plan(
        task("src", emits={"xs": "object"}),
        task("m", needs=["src"], map="src.xs", emits={"v": "string"}),
        task("c", needs=["m"], inputs={"vs": "m.v"}),
        version=2,
    )
    keys = {"b": 0, "a/../../x": 0, "..": 0, "%2e%2e": 0}
    settle(p, state, "src", {"xs": keys})
    order = ["%2e%2e", "..", "a/../../x", "b"]  # UTF-16 order
    for k in order:
        settle(p, state, "m", {"v": "val " + k}, key=k)
    StateDir(p, state).settle_fold("m", order)
    StateDir(p, state).stage_inputs("c", ws)
    fold = ws / "inputs" / "@values" / "vs"
    assert sorted(os.listdir(fold)) == sorted(
        ["%252e%252e", "%2E%2E", "a%2F%2E%2E%2F%2E%2E%2Fx", "b"]
    )
    entry = _index(ws)["inputs"][0]
    assert entry["fold"] is True and entry["status"] == "passed"
    assert [e["key"] for e in entry["entries"]] == order
    for e in entry["entries"]:
        data = (ws / e["path"]).read_bytes()
        assert json.loads(data) == "val " + e["key"] and e["digest"] == digest.of_bytes(data)
    assert entry["size"] == sum(e["size"] for e in entry["entries"])


def test_v2_array_fold_keys_are_indices(state: Path, ws: Path) -> None:
    p = plan(
        task("src", emits={"xs": "array"}),
        task("m", needs=["src"], map="src.xs", emits={"v": "integer"}),
        task("c", needs=["m"], inputs={"vs": "m.v"}),
        version=2,
    )
    settle(p, state, "src", {"xs": list(range(12))})
    keys = [str(i) for i in range(12)]
    for k in keys:
        settle(p, state, "m", {"v": int(k) * 10}, key=k)
    StateDir(p, state).settle_fold("m", keys)
    StateDir(p, state).stage_inputs("c", ws)
    entries = _index(ws)["inputs"][0]["entries"]
    assert [e["key"] for e in entries] == keys  # 0..11, not "0","1","10","11","2"
    assert (ws / "inputs" / "@values" / "vs" / "11").read_bytes() == b"110"


def test_v2_reserved_inputs_where_they_apply(state: Path, ws: Path) -> None:
    p = plan(
        task("src", emits={"xs": "array"}),
        task("m", "agent", needs=["src"], map="src.xs", prompt="go"),
        task("e", "evaluate", needs=["m"], join="settled", epilogue=True),
        version=2,
        params={"n": {"type": "integer", "default": 5}},
    )
    (state / "reserved").mkdir()
    for name, value in (("history", ["h"]), ("revision", 3), ("kept", {"best": 1})):
        (state / "reserved" / f"{name}.json").write_bytes(canon.dumps(value))
    settle(p, state, "src", {"xs": ["i0"], "note": "u" * 70000}, emit_cap=65536)
    StateDir(p, state).stage_inputs("m", ws, key="0")
    values = ws / "inputs" / "@values"
    assert sorted(os.listdir(values)) == ["history", "index.json", "item", "kept", "revision"]
    assert (values / "item").read_bytes() == b'"i0"'  # agents never get params
    settle(p, state, "m", None, key="0")
    StateDir(p, state).settle_fold("m", ["0"])
    ws2 = ws.parent / "ws2"
    StateDir(p, state).stage_inputs("e", ws2)
    v2 = ws2 / "inputs" / "@values"
    assert sorted(os.listdir(v2)) == [
        "history",
        "index.json",
        "kept",
        "outcome",
        "params",
        "revision",
    ]
    assert json.loads((v2 / "params").read_bytes()) == {"n": 5}
    outcome = json.loads((v2 / "outcome").read_bytes())
    assert outcome["tasks"]["src"]["status"] == "passed"
    # undeclared fields, uncapped; declared ones are not repeated
    assert outcome["tasks"]["src"]["fields"] == {"note": "u" * 70000}
    assert outcome["tasks"]["m"]["instances"] == [
        {"key": "0", "status": "passed", "note": "", "fields": {}}
    ]
    names = [(e["name"], e["kind"]) for e in _index(ws2)["inputs"]]
    assert names == [
        ("params", "reserved"),
        ("history", "reserved"),
        ("revision", "reserved"),
        ("kept", "reserved"),
        ("outcome", "reserved"),
    ]


def test_settled_join_stages_from_retained_failure_output(state: Path, ws: Path) -> None:
    p = plan(
        task("a", emits={"x": "integer"}, emits_files=["f.txt"]),
        task("b", emits={"x": "integer"}),
        task("s", emits={"x": "integer"}),
        task(
            "c",
            needs=["a", "b", "s"],
            join="settled",
            inputs={"ax": "a.x", "bx": "b.x", "sx": "s.x"},
        ),
        version=2,
    )
    settle(p, state, "a", {"x": "not an int"}, exit_code=3, files={"f.txt": b"partial"})
    settle(p, state, "b", None, exit_code=1)
    StateDir(p, state).record_settled("s", status="skipped", note="upstream failed")
    StateDir(p, state).stage_inputs("c", ws)
    by_name = {e["name"]: e for e in _index(ws)["inputs"]}
    a = by_name["ax"]
    assert a["status"] == "failed" and a["note"] == "exited with status 3"
    assert a["value_staged"] is True and a["files_staged"] is True
    assert (ws / "inputs" / "@values" / "ax").read_bytes() == b'"not an int"'
    assert (ws / "inputs" / "a" / "f.txt").read_bytes() == b"partial"
    b = by_name["bx"]
    assert b["status"] == "failed" and b["value_staged"] is False and b["path"] is None
    assert not (ws / "inputs" / "@values" / "bx").exists()
    assert by_name["sx"]["status"] == "skipped" and by_name["sx"]["value_staged"] is False


def test_join_all_with_a_producer_that_did_not_pass_is_refused(state: Path, ws: Path) -> None:
    p = plan(
        task("a", emits={"x": "integer"}), task("c", needs=["a"], inputs={"x": "a.x"}), version=2
    )
    with pytest.raises(InputRefused, match="absent"):
        StateDir(p, state).stage_inputs("c", ws)
    settle(p, state, "a", {"x": 1}, exit_code=1)
    with pytest.raises(InputRefused, match="joins all"):
        StateDir(p, state).stage_inputs("c", ws)


# -- files and atomicity --------------------------------------------------------


def test_every_ancestors_files_are_staged_read_only(state: Path, ws: Path) -> None:
    p = plan(
        task("g", emits_files=["g.txt"]),
        task("src", needs=["g"], emits={"xs": "array"}),
        task("m", needs=["src"], map="src.xs", emits_files=["o/*"]),
        task("c", needs=["m"]),
    )
    settle(p, state, "g", None, files={"g.txt": b"grand"})
    settle(p, state, "src", {"xs": ["../up"]})
    settle(p, state, "m", None, key="0", files={"o/r": b"inst"})
    StateDir(p, state).settle_fold("m", ["0"])
    staged = StateDir(p, state).stage_inputs("c", ws)
    assert (ws / "inputs" / "g" / "g.txt").read_bytes() == b"grand"
    inst = ws / "inputs" / "m" / "0" / "o" / "r"
    assert inst.read_bytes() == b"inst" and _readonly(inst)
    assert staged.files_staged == ("g", "m/0") and staged.files_bytes == 9


def test_files_bound_is_a_clear_error_and_leaves_no_inputs(state: Path, ws: Path) -> None:
    p = plan(task("a", emits_files=["f"]), task("c", needs=["a"]))
    settle(p, state, "a", None, files={"f": b"x" * 10})
    with pytest.raises(InputRefused, match="bound of 9 bytes"):
        StateDir(p, state).stage_inputs("c", ws, files_max=9)
    assert os.listdir(ws) == []


def test_failure_keeps_the_previous_inputs_and_leaves_no_temp(state: Path, ws: Path) -> None:
    p = plan(
        task("a", emits={"x": "integer"}), task("c", needs=["a"], inputs={"x": "a.x"}), version=2
    )
    settle(p, state, "a", {"x": 1})
    StateDir(p, state).stage_inputs("c", ws)
    before = _index(ws)
    (state / "results" / "a.json").write_text("{broken")
    with pytest.raises(ParseError, match=r"a\.json"):
        StateDir(p, state).stage_inputs("c", ws)
    assert os.listdir(ws) == ["inputs"] and _index(ws) == before
    # and a successful re-stage replaces it whole
    settle(p, state, "a", {"x": 2})
    StateDir(p, state).stage_inputs("c", ws)
    assert (ws / "inputs" / "@values" / "x").read_bytes() == b"2"
    assert os.listdir(ws) == ["inputs"]


def test_bad_params_and_reserved_files(state: Path, ws: Path) -> None:
    p = plan(task("c"), params={"req": {"type": "string"}})
    with pytest.raises(InputRefused, match="no default"):
        StateDir(p, state).stage_inputs("c", ws)
    (state / "params.json").write_text("[]")
    with pytest.raises(InputRefused, match="params must be a JSON object"):
        StateDir(p, state).stage_inputs("c", ws)
    (state / "params.json").write_text("{}")
    (state / "reserved").mkdir()
    (state / "reserved" / "kept.json").write_text("{nope")
    with pytest.raises(ParseError, match=r"kept\.json"):
        StateDir(p, state).stage_inputs("c", ws)
    assert os.listdir(ws) == []


def test_epilogue_is_staged_like_a_settled_join(state: Path, ws: Path) -> None:
    p = plan(
        task("a", emits={"x": "integer"}),
        task("e", needs=["a"], inputs={"x": "a.x"}, epilogue=True),
        version=2,
    )
    settle(p, state, "a", None, exit_code=9)
    staged = StateDir(p, state).stage_inputs("e", ws)
    assert staged.index is not None
    x = staged.index["inputs"][0]
    assert x["status"] == "failed" and x["value_staged"] is False
    outcome = json.loads((ws / "inputs" / "@values" / "outcome").read_bytes())
    assert outcome == {
        "tasks": {"a": {"status": "failed", "note": "exited with status 9", "fields": {}}}
    }


def test_map_items_follows_the_plans_field(state: Path) -> None:

    p1 = plan(
        task("src", emits={"a": "array", "b": "array"}), task("m", needs=["src"], map="src.a")
    )
    p2 = plan(
        task("src", emits={"a": "array", "b": "array"}), task("m", needs=["src"], map="src.b")
    )
    settle(p1, state, "src", {"a": [1], "b": [2, 3]})
    assert StateDir(p1, state).map_items("m") == [("0", 1)]
    assert StateDir(p2, state).map_items("m") == [("0", 2), ("1", 3)]


@pytest.mark.parametrize(
    "value",
    [
        "plain",
        '\u2028\u007f\x1f"\\/é\U0001f600\ue000',
        0,
        -(2**53 - 1),
        2**53 - 1,
        True,
        None,
        1.5,
        [1, {"\ue000": 1, "z": 2}],
    ],
)
def test_value_files_are_canonical_bytes(state: Path, ws: Path, value: object) -> None:
    p = plan(task("a", emits={"x": "any"}), task("c", needs=["a"], inputs={"x": "a.x"}), version=2)
    settle(p, state, "a", {"x": value})
    StateDir(p, state).stage_inputs("c", ws)
    assert (ws / "inputs" / "@values" / "x").read_bytes() == canon.dumps(value)
    index = (ws / "inputs" / "@values" / "index.json").read_bytes()
    assert index == canon.dumps(json.loads(index))
