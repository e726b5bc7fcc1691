"""The scored loop's reserved inputs as stage hands them (issue 18 item 3;
docs/spec/inputs.md 3.6): edition 1 vs edition 3 staging of revision, history
and kept, the history budget's drop stated, revision keys of the loop body, and
the kept revision's files staged read-only into the next revision."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crucible.core import canon
from crucible.core.errors import InputRefused
from crucible.core.plan import Plan
from crucible.run.loop import _inputs as li
from crucible.stage import StateDir, StateLayout
from tests.packed import keyed
from tests.stage.stageplans import loop_entry, plan, settle, task

SCHEMAS = Path(__file__).resolve().parents[2] / "docs" / "schemas"


def rev_entry(n: int, score: Any, *, kept: bool = False, note: str = "") -> dict[str, Any]:
    return loop_entry(n, score, kept=kept, note=note)


def loop_plan(**extra: Any) -> dict[str, Any]:
    """before -> propose -> evaluate -> report; beside runs alone; an epilogue."""
    p = plan(
        task("before", emits={"seed": "integer"}, emits_files=["seed.txt"]),
        task(
            "propose",
            "agent",
            needs=["before"],
            emits={"x": "integer"},
            emits_files=["work/**"],
            inputs={"seed": "before.seed"},
            prompt="Improve x.",
        ),
        task(
            "evaluate",
            "evaluate",
            needs=["propose"],
            emits={"score": "number"},
            inputs={"x": "propose.x"},
        ),
        task("report", needs=["evaluate", "propose"], inputs={"score": "evaluate.score"}),
        task("beside"),
        task("epi", epilogue=True),
        version=2,
    )
    p["version"], p["edition"] = 3, 4
    p["loop"] = {
        "body": ["evaluate", "propose"],
        "direction": "max",
        "history_bytes": 65536,
        "max_revisions": 10,
        "metric": "score",
        "min_delta": 0,
        "score": "evaluate",
        **extra,
    }
    return p


def run_revision(p: dict[str, Any], state: Path, n: int, x: int, score: float) -> None:
    """What the engine does for revision n: stage and settle propose, then evaluate."""
    key = li.revision_key(n)
    layout = StateLayout(state)
    ws = layout.work_dir("propose", key)
    StateDir(p, state).stage_inputs("propose", ws, key=key)
    (ws / "work").mkdir(exist_ok=True)
    (ws / "work" / "x.txt").write_text(f"{x}\n")
    (ws / "out.json").write_bytes(canon.dumps({"x": x}))
    rec = StateDir(p, state).capture(
        "propose", ws, output_file=ws / "out.json", exit_code=0, key=key
    )
    assert rec["status"] == "passed", rec["note"]
    ws = layout.work_dir("evaluate", key)
    staged = StateDir(p, state).stage_inputs("evaluate", ws, key=key)
    assert canon.loads((ws / "inputs" / "@values" / "x").read_bytes()) == x
    assert (ws / "inputs" / "propose" / "work" / "x.txt").read_text() == f"{x}\n"
    assert staged.index is not None
    (ws / "out.json").write_bytes(canon.dumps({"score": score}))
    rec = StateDir(p, state).capture(
        "evaluate", ws, output_file=ws / "out.json", exit_code=0, key=key
    )
    assert rec["status"] == "passed", rec["note"]


def entries(index: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in index["inputs"]}


def _validate(index: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((SCHEMAS / "inputs-index.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(index)


# -- edition 1 vs edition 3 ----------------------------------------------------


def _reserved_state(state: Path, budget: int) -> tuple[list[Any], int, dict[str, Any] | None]:
    revs = [rev_entry(i, i / 10, kept=i == 3, note="n" * 40) for i in range(1, 8)]
    history, dropped = li.history_value(revs, budget)
    kept = li.kept_value(3, 0.3, {"a": {"x": 3}})
    li.write_reserved(state, 8, (history, dropped), kept, budget=budget)
    return history, dropped, kept


def test_edition_1_gets_revision_history_kept_in_the_whole_object(state: Path, ws: Path) -> None:
    p = plan(task("a", emits={"x": "integer"}), task("b", needs=["a"]))
    settle(p, state, "a", {"x": 1})
    history, dropped, kept = _reserved_state(state, 65536)
    staged = StateDir(p, state).stage_inputs("b", ws)
    obj = json.loads((ws / "inputs" / "@inputs.json").read_bytes())
    assert obj["revision"] == 8 and obj["history"] == history and obj["kept"] == kept
    assert dropped == 0 and obj["@history"] == {"dropped": 0}
    assert json.loads(staged.env["CRUCIBLE_INPUTS"]) == obj
    assert not (ws / "inputs" / "@values").exists()


def test_edition_3_gets_one_file_each_listed_in_the_index(state: Path, ws: Path) -> None:
    p = plan(
        task("a", emits={"x": "integer"}), task("b", needs=["a"], inputs={"x": "a.x"}), version=2
    )
    settle(p, state, "a", {"x": 1})
    history, _, kept = _reserved_state(state, 65536)
    staged = StateDir(p, state).stage_inputs("b", ws)
    values = ws / "inputs" / "@values"
    for name, value in (("revision", 8), ("history", history), ("kept", kept)):
        assert (values / name).read_bytes() == canon.dumps(value)
        assert (values / name).stat().st_mode & 0o777 == 0o444
    assert staged.index is not None
    by = entries(staged.index)
    assert [e["name"] for e in staged.index["inputs"]] == [
        "x",
        "params",
        "history",
        "revision",
        "kept",
    ]
    assert by["history"]["dropped"] == 0 and by["history"]["kind"] == "reserved"
    assert "dropped" not in by["revision"] and "dropped" not in by["kept"]
    assert "CRUCIBLE_INPUTS" not in staged.env and "CRUCIBLE_INPUTS_FILE" not in staged.env
    _validate(staged.index)


def test_the_history_budget_drops_the_oldest_and_says_so(state: Path, ws: Path) -> None:
    p2 = plan(
        task("a", emits={"x": "integer"}), task("b", needs=["a"], inputs={"x": "a.x"}), version=2
    )
    p1 = plan(task("a", emits={"x": "integer"}), task("b", needs=["a"]))
    settle(p2, state, "a", {"x": 1})
    history, dropped, _ = _reserved_state(state, 400)
    assert dropped > 0 and [r["revision"] for r in history][-1] == 7
    assert history[0]["revision"] == 1 + dropped  # the oldest went first
    staged = StateDir(p2, state).stage_inputs("b", ws)
    assert staged.index is not None
    entry = entries(staged.index)["history"]
    assert entry["dropped"] == dropped and entry["size"] <= 400
    _validate(staged.index)
    ws1 = ws.parent / "ws1"
    StateDir(p1, state).stage_inputs("b", ws1)
    obj = json.loads((ws1 / "inputs" / "@inputs.json").read_bytes())
    assert obj["@history"] == {"dropped": dropped} and obj["history"] == history


def test_a_history_without_meta_stages_as_before(state: Path, ws: Path) -> None:
    p = plan(task("b"), version=2)
    (state / "reserved").mkdir()
    (state / "reserved" / "history.json").write_bytes(canon.dumps([1]))
    staged = StateDir(p, state).stage_inputs("b", ws)
    assert staged.index is not None and "dropped" not in entries(staged.index)["history"]
    li.write_reserved(state, 1, [1], None)  # a bare list: the drop is not known
    staged = StateDir(p, state).stage_inputs("b", ws)
    assert staged.index is not None and "dropped" not in entries(staged.index)["history"]


def test_a_bad_meta_file_is_named(state: Path, ws: Path) -> None:
    from crucible.core.errors import ParseError

    p = plan(task("b"), version=2)
    (state / "reserved").mkdir()
    (state / "reserved" / "history.json").write_bytes(b"[]")
    meta = state / "reserved" / "meta.json"
    meta.write_bytes(b"{nope")
    with pytest.raises(ParseError) as exc:
        StateDir(p, state).stage_inputs("b", ws)
    assert "meta.json" in str(exc.value.where)
    meta.write_bytes(canon.dumps({"format": li.META_FORMAT, "history": {"dropped": -1}}))
    with pytest.raises(InputRefused, match="dropped"):
        StateDir(p, state).stage_inputs("b", ws)
    meta.write_bytes(canon.dumps({"format": "other/1"}))
    with pytest.raises(InputRefused, match=r"crucible\.reserved-meta/1"):
        StateDir(p, state).stage_inputs("b", ws)


# -- revisions of the loop body -------------------------------------------------


def test_each_revision_reads_its_own_producers(state: Path) -> None:
    p = loop_plan()
    settle(p, state, "before", {"seed": 7}, files={"seed.txt": b"7"})
    li.write_reserved(state, 1, [], None)
    run_revision(p, state, 1, 10, 0.1)
    li.reserve(state, Plan.from_json(p), 2, [rev_entry(1, 0.1, kept=True)])
    run_revision(p, state, 2, 20, 0.2)  # evaluate@rev2 reads propose@rev2: x = 20, its x.txt
    layout = StateLayout(state)
    assert layout.result_path("propose", "@rev2") == state / "results" / "propose.jsonl"
    ws = layout.work_dir("propose", "@rev2")
    assert ws == state / "work" / "propose" / "%40rev2"
    # a before task is read plainly, its files too
    assert canon.loads((ws / "inputs" / "@values" / "seed").read_bytes()) == 7
    assert (ws / "inputs" / "before" / "seed.txt").read_bytes() == b"7"
    # no item for a revision
    idx = json.loads((ws / "inputs" / "@values" / "index.json").read_bytes())
    assert "item" not in entries(idx) and entries(idx)["revision"]["size"] == 1


def test_a_revision_key_is_only_for_a_body_task(state: Path, ws: Path) -> None:
    p = loop_plan()
    settle(p, state, "before", {"seed": 7}, files={"seed.txt": b"7"})
    with pytest.raises(InputRefused, match="not in the plan's loop body"):
        StateDir(p, state).stage_inputs("before", ws, key="@rev1")
    flat = plan(task("a"), version=2)
    with pytest.raises(InputRefused, match="not in the plan's loop body"):
        StateDir(flat, state).stage_inputs("a", ws, key="@rev1")
    with pytest.raises(InputRefused, match="not mapped"):
        StateDir(p, state).stage_inputs(
            "propose", ws, key="@rev01"
        )  # not a revision key's spelling


def test_kept_files_are_staged_into_the_next_revision_read_only(state: Path) -> None:
    p = loop_plan()
    settle(p, state, "before", {"seed": 7}, files={"seed.txt": b"7"})
    li.write_reserved(state, 1, [], None)
    run_revision(p, state, 1, 10, 0.9)
    first = StateLayout(state).work_dir("propose", "@rev1")
    assert not (first / "inputs" / "@kept").exists()  # nothing kept before revision 1
    idx1 = json.loads((first / "inputs" / "@values" / "index.json").read_bytes())
    assert "kept_files" not in entries(idx1)["kept"]
    _, _, kept = li.reserve(state, Plan.from_json(p), 2, [rev_entry(1, 0.9, kept=True)])
    assert kept == {
        "revision": 1,
        "score": 0.9,
        "outputs": {"evaluate": {"score": 0.9}, "propose": {"x": 10}},
    }
    run_revision(p, state, 2, 20, 0.5)  # not improved: revision 1 stays kept
    li.reserve(state, Plan.from_json(p), 3, [rev_entry(1, 0.9, kept=True), rev_entry(2, 0.5)])
    ws = StateLayout(state).work_dir("propose", "@rev3")
    staged = StateDir(p, state).stage_inputs("propose", ws, key="@rev3")
    got = ws / "inputs" / "@kept" / "propose" / "work" / "x.txt"
    assert got.read_text() == "10\n"  # the kept revision's, not the latest
    assert got.stat().st_mode & 0o777 == 0o444
    rec1 = keyed(state, "propose")["@rev1"]
    from crucible.core import digest

    assert digest.of_file(got) == rec1["files"][0]["digest"]
    assert staged.index is not None
    entry = entries(staged.index)["kept"]
    assert entry["files_staged"] is True
    assert entry["kept_files"] == [
        {"producer": "propose", "key": "@rev1", "path": "inputs/@kept/propose", "size": 3}
    ]
    assert canon.loads((ws / "inputs" / "@values" / "kept").read_bytes())["revision"] == 1
    _validate(staged.index)
    # the evaluate task of revision 3 gets them too; evaluate (no files) adds no unit
    (ws / "out.json").write_bytes(canon.dumps({"x": 30}))
    StateDir(p, state).capture("propose", ws, output_file=ws / "out.json", exit_code=0, key="@rev3")
    ws_e = StateLayout(state).work_dir("evaluate", "@rev3")
    StateDir(p, state).stage_inputs("evaluate", ws_e, key="@rev3")
    assert (ws_e / "inputs" / "@kept" / "propose" / "work" / "x.txt").read_text() == "10\n"
    assert not (ws_e / "inputs" / "@kept" / "evaluate").exists()


def test_a_kept_store_changed_after_capture_is_refused(state: Path) -> None:
    p = loop_plan()
    settle(p, state, "before", {"seed": 7}, files={"seed.txt": b"7"})
    li.write_reserved(state, 1, [], None)
    ws1 = StateLayout(state).work_dir("propose", "@rev1")
    StateDir(p, state).stage_inputs("propose", ws1, key="@rev1")
    (ws1 / "work").mkdir()
    (ws1 / "work" / "x.txt").write_text("10\n")
    (ws1 / "out.json").write_bytes(canon.dumps({"x": 10}))
    StateDir(p, state).capture(
        "propose", ws1, output_file=ws1 / "out.json", exit_code=0, key="@rev1"
    )
    # its files were never staged yet (no evaluate ran): the kept staging publishes them
    kept = li.kept_value(1, 0.9, {"propose": {"x": 10}, "evaluate": {"score": 0.9}})
    li.write_reserved(state, 2, [li.history_record(rev_entry(1, 0.9, kept=True))], kept)
    store = state / "files" / "propose" / "%40rev1" / "work" / "x.txt"
    store.chmod(0o644)
    store.write_text("99\n")
    ws = StateLayout(state).work_dir("propose", "@rev2")
    with pytest.raises(InputRefused, match="no longer matches the digest its capture recorded"):
        StateDir(p, state).stage_inputs("propose", ws, key="@rev2")
    assert not (ws / "inputs").exists()


def test_a_body_task_writing_a_kept_file_is_named(state: Path) -> None:
    p = loop_plan()
    settle(p, state, "before", {"seed": 7}, files={"seed.txt": b"7"})
    li.write_reserved(state, 1, [], None)
    run_revision(p, state, 1, 10, 0.9)
    li.reserve(state, Plan.from_json(p), 2, [rev_entry(1, 0.9, kept=True)])
    ws = StateLayout(state).work_dir("propose", "@rev2")
    StateDir(p, state).stage_inputs("propose", ws, key="@rev2")
    victim = ws / "inputs" / "@kept" / "propose" / "work" / "x.txt"
    if victim.stat().st_nlink == 1:
        pytest.skip("reflinked: a private copy")
    victim.chmod(0o644)
    victim.write_text("11\n")  # the agent edits its starting point in place instead of copying
    (ws / "out.json").write_bytes(canon.dumps({"x": 11}))
    (ws / "work").mkdir()
    (ws / "work" / "x.txt").write_text("11\n")
    rec = StateDir(p, state).capture(
        "propose", ws, output_file=ws / "out.json", exit_code=0, key="@rev2"
    )
    assert rec["status"] == "failed" and "inputs/@kept/propose/work/x.txt" in rec["note"]
    assert "propose[@rev2]" in rec["note"]
    # the published copy was restored for the next revision
    assert (state / "files" / "propose" / "%40rev1" / "work" / "x.txt").read_text() == "10\n"
    ws3 = StateLayout(state).work_dir("propose", "@rev3")
    StateDir(p, state).stage_inputs("propose", ws3, key="@rev3")
    assert (ws3 / "inputs" / "@kept" / "propose" / "work" / "x.txt").read_text() == "10\n"


# -- after, before, beside ------------------------------------------------------


def test_after_tasks_read_the_kept_revision_and_before_tasks_see_nothing(state: Path) -> None:
    p = loop_plan()
    settle(p, state, "before", {"seed": 7}, files={"seed.txt": b"7"})
    li.write_reserved(state, 1, [], None)
    run_revision(p, state, 1, 10, 0.9)
    li.reserve(state, Plan.from_json(p), 2, [rev_entry(1, 0.9, kept=True)])
    run_revision(p, state, 2, 20, 0.5)
    final = [rev_entry(1, 0.9, kept=True), rev_entry(2, 0.5)]
    li.reserve(state, Plan.from_json(p), 2, final)  # after the loop: every revision, the final kept
    ws = StateLayout(state).work_dir("report")
    staged = StateDir(p, state).stage_inputs("report", ws)
    assert canon.loads((ws / "inputs" / "@values" / "score").read_bytes()) == 0.9
    assert (ws / "inputs" / "propose" / "work" / "x.txt").read_text() == "10\n"
    assert staged.index is not None
    by = entries(staged.index)
    assert canon.loads((ws / "inputs" / "@values" / "history").read_bytes())[-1]["revision"] == 2
    assert by["kept"]["kept_files"][0]["key"] == "@rev1"
    # the epilogue sees them; the tasks before and beside the loop do not
    ws_epi = StateLayout(state).work_dir("epi")
    epi = StateDir(p, state).stage_inputs("epi", ws_epi)
    assert epi.index is not None and {"history", "revision", "kept"} <= set(entries(epi.index))
    for name in ("before", "beside"):
        other = StateDir(p, state).stage_inputs(name, StateLayout(state).work_dir(name))
        # with nothing to stage a task gets no tree and no index (inputs.md 3.7)
        seen = set() if other.index is None else set(entries(other.index))
        assert not {"history", "revision", "kept"} & seen, name
        assert not (StateLayout(state).work_dir(name) / "inputs" / "@kept").exists()


def test_stage_inputs_command_takes_a_revision_key(state: Path, tmp_path: Path) -> None:
    p = loop_plan()
    settle(p, state, "before", {"seed": 7}, files={"seed.txt": b"7"})
    (state / "plan.json").write_bytes(canon.dumps(p))
    li.write_reserved(state, 1, [], None)
    run_revision(p, state, 1, 10, 0.9)
    li.reserve(state, Plan.from_json(p), 2, [rev_entry(1, 0.9, kept=True)])
    exe = Path(sys.executable).parent / "crucible-stage"
    proc = subprocess.run(
        [
            str(exe),
            "inputs",
            "--state",
            str(state),
            "--task",
            "propose",
            "--key",
            "@rev2",
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**os.environ},
    )
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    values = Path(env["CRUCIBLE_INPUTS_DIR"])
    assert values == state.absolute() / "work" / "propose" / "%40rev2" / "inputs" / "@values"
    assert (values.parent / "@kept" / "propose" / "work" / "x.txt").read_text() == "10\n"
    proc = subprocess.run(
        [str(exe), "inputs", "--state", str(state), "--task", "before", "--key", "@rev2"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "loop body" in proc.stderr and "Traceback" not in proc.stderr


LOOP_PACK = """edition = 4

[workflow]
name = "k"

[[workflow.task]]
name = "propose"
emits = { x = "integer" }
emits_files = ["draft/**"]
run = "true"

[[workflow.task]]
name = "evaluate"
kind = "evaluate"
needs = ["propose"]
inputs = { x = "propose.x" }
emits = { score = "number" }
run = "true"

[loop]
body = ["propose", "evaluate"]
score = "evaluate"
metric = "score"
max_revisions = 20
history_bytes = 300
"""


def test_a_compiled_loop_through_the_stage_commands(tmp_path: Path) -> None:
    """crucible-compile's plan, then crucible-stage inputs/capture per revision as the
    engine calls them: the kept revision's draft reaches the next revision, and the
    history budget's drop is in the index."""
    from crucible.compile import compile_path

    manifest = tmp_path / "pack.toml"
    manifest.write_text(LOOP_PACK)
    p = compile_path(manifest).plan
    state = tmp_path / "state"
    state.mkdir()
    (state / "plan.json").write_bytes(canon.dumps(p))
    exe = str(Path(sys.executable).parent / "crucible-stage")

    def stage(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args, "--state", str(state)], capture_output=True, text=True)

    revs: list[dict[str, Any]] = []
    best = None
    for n, score in enumerate([0.2, 0.6, 0.4, 0.3, 0.5, 0.1], start=1):
        li.reserve(state, Plan.from_json(p), n, revs)
        key = li.revision_key(n)
        proc = stage("inputs", "--task", "propose", "--key", key, "--json")
        assert proc.returncode == 0, proc.stderr
        ws = state / "work" / "propose" / f"%40rev{n}"
        kept_draft = ws / "inputs" / "@kept" / "propose" / "draft" / "d.txt"
        if best is None:
            assert not kept_draft.exists()
        else:
            assert kept_draft.read_text() == f"draft {best}"
        (ws / "draft").mkdir()
        (ws / "draft" / "d.txt").write_text(f"draft {n}")
        (ws / "out.json").write_text(json.dumps({"x": n}))
        proc = stage(
            "capture",
            "--task",
            "propose",
            "--key",
            key,
            "--exit-code",
            "0",
            "--output",
            str(ws / "out.json"),
        )
        assert proc.returncode == 0, proc.stderr
        proc = stage("inputs", "--task", "evaluate", "--key", key, "--json")
        assert proc.returncode == 0, proc.stderr
        values = Path(json.loads(proc.stdout)["CRUCIBLE_INPUTS_DIR"])
        assert (values / "x").read_text() == str(n)
        index = json.loads((values / "index.json").read_text())
        assert (
            entries(index)["history"]["dropped"]
            == json.loads((state / "reserved" / "meta.json").read_text())["history"]["dropped"]
        )
        _validate(index)
        ews = values.parent.parent
        (ews / "out.json").write_text(json.dumps({"score": score}))
        proc = stage(
            "capture",
            "--task",
            "evaluate",
            "--key",
            key,
            "--exit-code",
            "0",
            "--output",
            str(ews / "out.json"),
        )
        assert proc.returncode == 0, proc.stderr
        kept = best is None or score > next(r["score"] for r in revs if r["revision"] == best)
        if kept:
            best = n
        revs.append(rev_entry(n, score, kept=kept))
    meta = json.loads((state / "reserved" / "meta.json").read_text())["history"]
    assert meta["dropped"] > 0 and meta["total"] == 5 and meta["budget"] == 300
    assert best == 2


def test_an_after_task_of_a_plain_run_reads_the_plain_records(state: Path) -> None:
    """A loop plan run once as a plain DAG (a driver simulating the loop writes
    kept.json itself): no revision records, so the after task reads the plain ones."""
    p = loop_plan()
    settle(p, state, "before", {"seed": 7}, files={"seed.txt": b"7"})
    settle(p, state, "propose", {"x": 5}, files={"work/x.txt": b"5\n"})
    settle(p, state, "evaluate", {"score": 0.5})
    li.write_reserved(state, 3, [], li.kept_value(2, 0.4, {"propose": {"x": 4}}))
    ws = StateLayout(state).work_dir("report")
    StateDir(p, state).stage_inputs("report", ws)
    assert canon.loads((ws / "inputs" / "@values" / "score").read_bytes()) == 0.5
    assert (ws / "inputs" / "propose" / "work" / "x.txt").read_text() == "5\n"


def test_a_kept_value_naming_strange_tasks_stages_no_files(state: Path) -> None:
    p = loop_plan()
    settle(p, state, "before", {"seed": 7}, files={"seed.txt": b"7"})
    for kept in (
        {"revision": 1, "score": 1, "outputs": {"../etc": {}, "nope": {}, "before": {}}},
        {"revision": True, "score": 1, "outputs": {"propose": {}}},
        {"revision": 9, "score": 1, "outputs": "propose"},
        [1, 2],
    ):
        li.write_reserved(state, 2, [], kept)  # type: ignore[arg-type]
        ws = StateLayout(state).work_dir("propose", "@rev2")
        staged = StateDir(p, state).stage_inputs("propose", ws, key="@rev2")
        assert not (ws / "inputs" / "@kept").exists(), kept
        assert staged.index is not None and "kept_files" not in entries(staged.index)["kept"]
