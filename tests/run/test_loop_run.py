"""The scored loop, end to end through crucible-dispatch (issue 18 items 2, 4, 6):
revisions, stopping, loop.json, events, after tasks, the epilogue's outcome.loop,
resume and signals.

The stand-in body: ``propose`` reads line N of the pack's scores.txt in revision
N (a number, ``fail`` for a scoring task that fails, ``crash`` for a proposer
that fails, ``sleep`` for one that hangs) and ``evaluate`` scores it."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.packed import keyed
from tests.run.dispatchtests import DISPATCH, dispatch, events, result, wait_for

PACK = """edition = 4

[workflow]
name = "loop-test"

[[workflow.task]]
name = "seed"
run = '''echo '{"start": 0}' > "$CRUCIBLE_OUTPUT"'''
emits = { start = "integer" }

[[workflow.task]]
name = "propose"
needs = ["seed"]
run = '''
r=$(cat "$CRUCIBLE_INPUTS_DIR/revision")
v=$(sed -n "${r}p" "$CRUCIBLE_PACK_DIR/scores.txt")
case $v in crash) exit 3;; sleep) echo sleeping > "$CRUCIBLE_PACK_DIR/sleeping.$r"; sleep 30;; esac
echo "revision $r proposes $v" > out.txt
printf '{"value": "%s"}' "$v" > "$CRUCIBLE_OUTPUT"
'''
emits = { value = "string" }
emits_files = ["out.txt"]

[[workflow.task]]
name = "evaluate"
kind = "evaluate"
needs = ["propose"]
inputs = { value = "propose.value" }
run = '''
v=$(tr -d '"' < "$CRUCIBLE_INPUTS_DIR/value")
[ "$v" = fail ] && exit 3
printf '{"score": %s, "verdict": "pass"}' "$v" > "$CRUCIBLE_OUTPUT"
'''
emits = { score = "number" }

[[workflow.task]]
name = "final"
needs = ["evaluate", "propose"]
inputs = { best = "evaluate.score" }
run = '''
cp "$CRUCIBLE_INPUTS_DIR/best" "$CRUCIBLE_PACK_DIR/final.best"
cp inputs/propose/out.txt "$CRUCIBLE_PACK_DIR/final.out"
echo '{}' > "$CRUCIBLE_OUTPUT"
'''

[[workflow.task]]
name = "summary"
epilogue = true
run = '''cp "$CRUCIBLE_INPUTS_DIR/outcome" "$CRUCIBLE_PACK_DIR/outcome.json"; echo '{}' > "$CRUCIBLE_OUTPUT"'''

[loop]
body = ["propose", "evaluate"]
score = "evaluate"
metric = "score"
"""


def make_pack(root: Path, scores: list[object], loop: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "scores.txt").write_text("".join(f"{s}\n" for s in scores))
    path = root / "pack.toml"
    path.write_text(PACK + loop)
    return path


def loop_doc(state: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((state / "loop.json").read_bytes())
    return doc


def scores(doc: dict[str, Any]) -> list[Any]:
    return [r["score"] for r in doc["revisions"]]


@pytest.fixture
def pack_dir(tmp_path: Path) -> Path:
    return tmp_path / "pack"


def test_converges_to_target_and_after_tasks_see_the_kept_revision(
    pack_dir: Path, tmp_path: Path
) -> None:
    plan = make_pack(pack_dir, [0.2, 0.5, 0.4, 0.9, 0.95], "max_revisions = 10\ntarget = 0.9\n")
    state = tmp_path / "s"
    proc = dispatch(plan, "--state", state, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    doc = loop_doc(state)
    assert doc["stop_reason"] == "target" and doc["finished"] is True
    assert scores(doc) == [0.2, 0.5, 0.4, 0.9]
    assert [r["verdict"] for r in doc["revisions"]] == [
        "improved", "improved", "not_improved", "improved"
    ]  # fmt: skip
    assert [r["kept"] for r in doc["revisions"]] == [True, True, False, True]
    assert doc["revisions"][0]["delta"] is None
    assert doc["revisions"][2]["delta"] == pytest.approx(-0.1)
    assert doc["kept_revision"] == 4 and doc["best_score"] == 0.9
    assert doc["revisions"][3]["fields"] == {"score": 0.9}
    # each revision has its own records, workspaces and logs
    for n in range(1, 5):
        rec = result(state, "evaluate", f"@rev{n}")
        assert rec is not None and rec["key"] == f"@rev{n}"
        assert (state / "files" / "propose" / f"%40rev{n}" / "out.txt").is_file()
    assert result(state, "evaluate", "@rev5") is None
    # the plain records are the kept revision's; the after task staged them
    plain = result(state, "evaluate")
    assert plain is not None and plain["output"]["score"] == 0.9
    assert plain["extra"]["revision"] == 4
    assert (pack_dir / "final.best").read_text() == "0.9"
    assert (pack_dir / "final.out").read_text() == "revision 4 proposes 0.9\n"
    # session events
    evs = events(state)
    started = [e["revision"] for e in evs if e["event"] == "revision_started"]
    finished = [e for e in evs if e["event"] == "revision_finished"]
    assert started == [1, 2, 3, 4]
    assert [e["kept"] for e in finished] == [True, True, False, True]
    assert all(isinstance(e["duration_ms"], int) and e["reason"] for e in finished)
    (done,) = [e for e in evs if e["event"] == "loop_finished"]
    assert done["stop_reason"] == "target" and done["kept_revision"] == 4
    # the epilogue's outcome carries the loop's
    outcome = json.loads((pack_dir / "outcome.json").read_bytes())
    assert outcome["loop"] == {
        "stop_reason": "target", "revisions": 4, "kept_revision": 4, "best_score": 0.9
    }  # fmt: skip
    # the task units run in revision order, the body after seed, final after the loop
    order = [(e["task"], e.get("key")) for e in evs if e["event"] == "task_started"]
    assert order[0] == ("seed", None) and order[-2:] == [("final", None), ("summary", None)]


def test_direction_min_and_max_revisions(pack_dir: Path, tmp_path: Path) -> None:
    plan = make_pack(pack_dir, [5, 3, 4], 'direction = "min"\nmax_revisions = 3\n')
    state = tmp_path / "s"
    proc = dispatch(plan, "--state", state)
    assert proc.returncode == 0, proc.stderr
    doc = loop_doc(state)
    assert doc["stop_reason"] == "max_revisions" and scores(doc) == [5, 3, 4]
    assert doc["kept_revision"] == 2 and doc["best_score"] == 3


def test_patience_with_min_delta(pack_dir: Path, tmp_path: Path) -> None:
    # 0.505 and 0.509 improve on 0.5 by less than min_delta: patience is not reset
    plan = make_pack(
        pack_dir,
        [0.5, 0.505, 0.509, 0.7, 0.8],
        "max_revisions = 10\npatience = 2\nmin_delta = 0.01\n",
    )
    state = tmp_path / "s"
    proc = dispatch(plan, "--state", state)
    assert proc.returncode == 0, proc.stderr
    doc = loop_doc(state)
    assert doc["stop_reason"] == "patience"
    assert scores(doc) == [0.5, 0.505, 0.509]
    assert [r["kept"] for r in doc["revisions"]] == [True, False, False]
    assert doc["kept_revision"] == 1 and doc["best_score"] == 0.5


def test_a_failed_revision_is_recorded_never_kept_and_counts_for_patience(
    pack_dir: Path, tmp_path: Path
) -> None:
    plan = make_pack(pack_dir, [0.3, "fail", 0.9, 0.1], "max_revisions = 4\npatience = 2\n")
    state = tmp_path / "s"
    proc = dispatch(plan, "--state", state)
    assert proc.returncode == 0, proc.stderr  # a failed revision does not fail the run
    doc = loop_doc(state)
    failed = doc["revisions"][1]
    assert failed["status"] == "failed" and failed["verdict"] == "failed"
    assert failed["score"] is None and failed["kept"] is False and failed["delta"] is None
    assert "score task 'evaluate' failed" in failed["note"]
    assert doc["kept_revision"] == 3 and doc["stop_reason"] == "max_revisions"
    # the next revision saw the failed one in its history, the kept one as kept
    rec = result(state, "evaluate", "@rev2")
    assert rec is not None and rec["status"] == "failed"
    assert "failed:" not in proc.stderr  # not listed as a failure of the run


def test_only_failed_revisions_keep_nothing_and_skip_after_tasks(
    pack_dir: Path, tmp_path: Path
) -> None:
    plan = make_pack(pack_dir, ["fail", "fail"], "max_revisions = 2\n")
    state = tmp_path / "s"
    proc = dispatch(plan, "--state", state)
    assert proc.returncode == 1, proc.stderr
    doc = loop_doc(state)
    assert doc["kept_revision"] is None and doc["best_score"] is None
    assert doc["stop_reason"] == "max_revisions"
    final = result(state, "final")
    assert final is not None and final["status"] == "skipped"
    assert final["note"] == "loop kept no revision"
    body = result(state, "evaluate")
    assert body is not None and body["status"] == "failed"


def test_a_failed_body_task_stops_the_loop_and_after_tasks_run_on_the_kept(
    pack_dir: Path, tmp_path: Path
) -> None:
    plan = make_pack(pack_dir, [0.4, "crash", 0.9], "max_revisions = 5\n")
    state = tmp_path / "s"
    proc = dispatch(plan, "--state", state)
    assert proc.returncode == 1, proc.stderr  # body_failed fails the run
    doc = loop_doc(state)
    assert doc["stop_reason"] == "body_failed" and len(doc["revisions"]) == 2
    assert doc["revisions"][1]["note"] == "body task 'propose' failed"
    assert doc["kept_revision"] == 1
    assert result(state, "evaluate", "@rev2") is None  # never started
    assert (pack_dir / "final.best").read_text() == "0.4"
    assert "propose[@rev2]" in proc.stderr


def test_time_budget_stops_a_running_revision(pack_dir: Path, tmp_path: Path) -> None:
    plan = make_pack(pack_dir, [0.1, 0.2, "sleep"], "max_revisions = 10\ntime_budget = 2\n")
    state = tmp_path / "s"
    began = time.monotonic()
    proc = dispatch(plan, "--state", state)
    assert time.monotonic() - began < 20  # not the 30 s sleep
    assert proc.returncode == 0, proc.stderr
    doc = loop_doc(state)
    assert doc["stop_reason"] == "time_budget"
    cut = doc["revisions"][2]
    assert cut["status"] == "failed" and "time budget" in cut["note"]
    assert doc["kept_revision"] == 2
    rec = result(state, "propose", "@rev3")
    assert rec is not None and "time budget ran out" in rec["note"]


def test_sigterm_mid_revision_then_resume_continues(pack_dir: Path, tmp_path: Path) -> None:
    plan = make_pack(pack_dir, [0.1, 0.2, "sleep", 0.5], "max_revisions = 4\n")
    state = tmp_path / "s"
    proc = subprocess.Popen(
        [DISPATCH, str(plan), "--state", str(state)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: (pack_dir / "sleeping.3").exists(), 30)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    doc = loop_doc(state)
    assert doc["stop_reason"] == "interrupted" and doc["finished"] is False
    assert len(doc["revisions"]) == 2  # the interrupted revision is not settled
    assert result(state, "propose", "@rev3") is None
    assert result(state, "evaluate") is None  # the body has not settled
    # resume: revision 3 reruns whole (it no longer sleeps), then 4
    (pack_dir / "scores.txt").write_text("0.1\n0.2\n0.3\n0.5\n")
    resumed = dispatch(plan, "--state", state, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    doc = loop_doc(state)
    assert doc["finished"] is True and doc["stop_reason"] == "max_revisions"
    assert scores(doc) == [0.1, 0.2, 0.3, 0.5]
    evs = events(state)
    assert [e["revision"] for e in evs if e["event"] == "revision_started"] == [1, 2, 3, 3, 4]
    session2 = [e for e in evs if e["session"] == 2 and e["event"] == "task_started"]
    assert ("seed", None) not in [(e["task"], e.get("key")) for e in session2]
    assert (pack_dir / "final.best").read_text() == "0.5"


def test_resume_of_a_finished_loop_reruns_no_revision(pack_dir: Path, tmp_path: Path) -> None:
    plan = make_pack(pack_dir, ["fail", 0.3], "max_revisions = 2\n")
    state = tmp_path / "s"
    assert dispatch(plan, "--state", state).returncode == 0
    (state / "results" / "final.json").unlink()  # something after the loop to run
    resumed = dispatch(plan, "--state", state, "--resume", "--retry-failed")
    assert resumed.returncode == 0, resumed.stderr
    evs = events(state)
    assert [e["revision"] for e in evs if e["event"] == "revision_started"] == [1, 2]
    assert loop_doc(state)["kept_revision"] == 2


def test_plan_changed_refuses_an_edited_loop(pack_dir: Path, tmp_path: Path) -> None:
    plan = make_pack(pack_dir, [0.1], "max_revisions = 1\n")
    state = tmp_path / "s"
    assert dispatch(plan, "--state", state).returncode == 0
    plan.write_text(plan.read_text().replace("max_revisions = 1", "max_revisions = 2"))
    resumed = dispatch(plan, "--state", state, "--resume")
    assert resumed.returncode == 1
    assert "PlanChanged" in resumed.stderr or "plan changed" in resumed.stderr.lower()


def test_reserved_inputs_are_written_before_each_revision(pack_dir: Path, tmp_path: Path) -> None:
    plan = make_pack(pack_dir, [0.2, 0.1, 0.3], "max_revisions = 3\n")
    state = tmp_path / "s"
    # kept: a passed revision's workspace is given back once its files are captured
    assert dispatch(plan, "--state", state, "--keep-workspaces").returncode == 0
    values = state / "work" / "propose" / "%40rev3" / "inputs" / "@values"
    assert (values / "revision").read_text() == "3"
    history = json.loads((values / "history").read_bytes())
    assert [h["revision"] for h in history] == [1, 2]
    assert [h["kept"] for h in history] == [True, False]
    kept = json.loads((values / "kept").read_bytes())
    assert kept["revision"] == 1 and kept["score"] == 0.2
    assert kept["outputs"]["evaluate"] == {"score": 0.2}
    # revision 1 saw no history and nothing kept
    first = state / "work" / "propose" / "%40rev1" / "inputs" / "@values"
    assert json.loads((first / "history").read_bytes()) == []
    assert json.loads((first / "kept").read_bytes()) is None
    # the task before the loop saw none of them
    assert not (state / "work" / "seed" / "inputs" / "@values" / "revision").exists()


def test_revision_keys_and_env(pack_dir: Path, tmp_path: Path) -> None:
    plan = make_pack(pack_dir, [0.5], "max_revisions = 1\n")
    state = tmp_path / "s"
    assert dispatch(plan, "--state", state).returncode == 0
    evs = events(state)
    keys = {e.get("key") for e in evs if e["event"] == "task_started" and e["task"] == "evaluate"}
    assert keys == {"@rev1"}
    spaces = {e["workspace"] for e in evs if e["event"] == "task_started" and e["task"] == "evaluate"}
    assert spaces == {"work/evaluate/%40rev1"}  # its workspace while it ran (recycled since)


def test_outputs_and_published_files_are_the_kept_revisions(pack_dir: Path, tmp_path: Path) -> None:
    plan = make_pack(pack_dir, [0.6, 0.2], "max_revisions = 2\n")
    plan.write_text(
        plan.read_text().replace(
            'name = "loop-test"\n',
            'name = "loop-test"\n[workflow.outputs]\nbest = "evaluate.score"\n'
            '[workflow.publish]\n"kept/" = "propose:*.txt"\n',
        )
    )
    state, dest = tmp_path / "s", tmp_path / "pub"
    proc = dispatch(plan, "--state", state, "--publish-dir", dest, "--outputs", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["best"] == 0.6
    assert (dest / "kept" / "out.txt").read_text() == "revision 1 proposes 0.6\n"
    assert sorted(p.name for p in (dest / "kept").iterdir()) == ["@publish.json", "out.txt"]


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("example", "reason", "kept"), [("loop", "target", 4), ("loop-patience", "patience", 4)]
)
def test_the_example_packs_run(example: str, reason: str, kept: int, tmp_path: Path) -> None:
    state = tmp_path / "s"
    proc = dispatch(REPO / "examples" / example / "pack.toml", "--state", state)
    assert proc.returncode == 0, proc.stderr
    doc = loop_doc(state)
    assert doc["stop_reason"] == reason and doc["kept_revision"] == kept
    assert doc["revisions"][kept - 1]["kept"] is True


@pytest.mark.parametrize(
    ("scores_", "loop"),
    [
        ([0.2, "fail", 0.9], "max_revisions = 3\ntarget = 0.5\n"),
        (["fail"], "max_revisions = 1\n"),
        ([0.4, "crash"], "max_revisions = 3\n"),
    ],
)
def test_loop_json_and_events_match_their_schemas(
    scores_: list[object], loop: str, pack_dir: Path, tmp_path: Path
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    plan = make_pack(pack_dir, scores_, loop)
    state = tmp_path / "s"
    dispatch(plan, "--state", state)
    schemas = REPO / "docs" / "schemas"
    jsonschema.validate(loop_doc(state), json.loads((schemas / "loop.json").read_bytes()))
    event_schema = json.loads((schemas / "session-event.json").read_bytes())
    kinds = set()
    for event in events(state):
        jsonschema.validate(event, event_schema)
        kinds.add(event["event"])
    assert {"revision_started", "revision_finished", "loop_finished"} <= kinds
    record_schema = json.loads((schemas / "result-record.json").read_bytes())
    for path in (state / "results").rglob("*.json"):
        jsonschema.validate(json.loads(path.read_bytes()), record_schema)
    for path in (state / "results").glob("*.jsonl"):  # the revisions' packed records
        for rec in keyed(state, path.stem).values():
            jsonschema.validate(rec, record_schema)


def test_conditions_and_joins_inside_a_revision(tmp_path: Path) -> None:
    """A body task's `when` sees its needs' statuses in the same revision; a
    false one skips its unit (and its join-all consumers), which does not stop
    the loop; a revision whose score task was skipped is a failed revision."""
    root = tmp_path / "pack"
    root.mkdir()
    plan = root / "pack.toml"
    plan.write_text(
        """edition = 4
[workflow]
name = "cond"
[[workflow.task]]
name = "propose"
run = '''r=$(cat "$CRUCIBLE_INPUTS_DIR/revision"); printf '{"n": %s}' "$r" > "$CRUCIBLE_OUTPUT"'''
emits = { n = "integer" }
[[workflow.task]]
name = "never"
needs = ["propose"]
when = "needs.propose.status == 'failed'"
run = "echo '{}' > \\"$CRUCIBLE_OUTPUT\\""
[[workflow.task]]
name = "evaluate"
kind = "evaluate"
needs = ["propose"]
inputs = { n = "propose.n" }
run = '''n=$(cat "$CRUCIBLE_INPUTS_DIR/n"); printf '{"score": %s, "verdict": "pass"}' "$n" > "$CRUCIBLE_OUTPUT"'''
emits = { score = "integer" }
[loop]
body = ["propose", "never", "evaluate"]
score = "evaluate"
metric = "score"
max_revisions = 3
"""
    )
    state = tmp_path / "s"
    proc = dispatch(plan, "--state", state)
    assert proc.returncode == 0, proc.stderr
    doc = loop_doc(state)
    assert scores(doc) == [1, 2, 3] and doc["kept_revision"] == 3
    rec = result(state, "never", "@rev2")
    assert rec is not None and rec["status"] == "skipped"
    assert rec["note"].startswith("condition false")


def test_retry_failed_after_a_loop_that_kept_nothing_reruns_no_revision(
    pack_dir: Path, tmp_path: Path
) -> None:
    plan = make_pack(pack_dir, ["fail", "fail", 0.5], "max_revisions = 2\n")
    state = tmp_path / "s"
    assert dispatch(plan, "--state", state).returncode == 1
    resumed = dispatch(plan, "--state", state, "--resume", "--retry-failed")
    assert resumed.returncode == 1, resumed.stderr
    evs = events(state)
    assert [e["revision"] for e in evs if e["event"] == "revision_started"] == [1, 2]
    assert len([e for e in evs if e["event"] == "loop_finished"]) == 1
    body = result(state, "evaluate")
    assert body is not None and body["note"] == "loop kept no revision"
    final = result(state, "final")
    assert final is not None and final["note"] == "loop kept no revision"


@pytest.mark.parametrize(("junk", "code"), [(b"junk\n", 2), (b'{"revisions": 3}', 1)])
def test_a_damaged_loop_json_is_named_on_resume(
    junk: bytes, code: int, pack_dir: Path, tmp_path: Path
) -> None:
    plan = make_pack(pack_dir, [0.1, 0.2], "max_revisions = 2\n")
    state = tmp_path / "s"
    assert dispatch(plan, "--state", state).returncode == 0
    for task in ("propose", "evaluate", "final", "summary"):
        (state / "results" / f"{task}.json").unlink()
    (state / "loop.json").write_bytes(junk)
    before = (state / "session.jsonl").read_bytes()
    resumed = dispatch(plan, "--state", state, "--resume")
    assert resumed.returncode == code
    assert resumed.stderr.count("\n") == 1 and "loop.json" in resumed.stderr
    assert "Traceback" not in resumed.stderr
    assert (state / "session.jsonl").read_bytes() == before
