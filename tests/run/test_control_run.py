"""Control flow through real ``crucible-dispatch`` runs: conditions and the skip table,
status triggers, tolerated failures, the retry policy, epilogues as a DAG
(docs/spec/run.md, "Control flow")."""

from __future__ import annotations

import json
import subprocess
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.run.dispatchtests import DISPATCH, start_dispatch

HEAD = """
edition = 4

[workflow]
name = "control"
"""

OK = "true"
FAIL = "exit 1"


def emit(obj: dict[str, Any]) -> str:
    """A shell ``run`` that writes ``obj`` as the task's result."""
    return f"echo '{json.dumps(obj)}' > \"$CRUCIBLE_OUTPUT\""


@dataclass
class Run:
    code: int
    stderr: str
    state: Path

    @property
    def events(self) -> list[dict[str, Any]]:
        lines = (self.state / "session.jsonl").read_bytes().splitlines()
        return [json.loads(line) for line in lines]

    def finished(self, task: str, key: str | None = None) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events
            if e["event"] == "task_finished" and e["task"] == task and e.get("key") == key
        ]

    def record(self, task: str, key: str | None = None) -> dict[str, Any]:
        from crucible import stage

        record = stage.load_result(self.state, task, key)
        assert record is not None, f"no record for {task} {key}"
        return record

    def status(self, task: str) -> str:
        return str(self.record(task)["status"])


def dispatch(tmp_path: Path, body: str, *args: str, name: str = "pack") -> Run:
    pack = tmp_path / f"{name}.toml"
    pack.write_text(textwrap.dedent(HEAD) + textwrap.dedent(body))
    state = tmp_path / f"{name}-state"
    proc = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    return Run(proc.returncode, proc.stderr, state)


def task(name: str, run: str, **keys: Any) -> str:
    lines = ["[[workflow.task]]", f"name = {json.dumps(name)}", f"run = {json.dumps(run)}"]
    for key, value in keys.items():
        lines.append(f"{key} = {_toml(value)}")
    return "\n" + "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


# -- conditions and the skip table ---------------------------------------------


def test_a_false_condition_skips_the_task_and_its_all_joined_dependants_only(
    tmp_path: Path,
) -> None:
    run = dispatch(
        tmp_path,
        task("build", OK)
        + task("publish", OK, needs=["build"], when="1 == 2")
        + task("announce", OK, needs=["publish"])
        + task("cleanup", OK, needs=["publish"], join="settled")
        + task("other", OK, needs=["build"]),
    )
    assert run.code == 0, run.stderr  # a false condition is no failure
    assert run.status("publish") == "skipped"
    assert run.record("publish")["note"] == "condition false: 1 == 2"
    assert run.status("announce") == "skipped"
    assert "needs 'publish', which was skipped" in run.record("announce")["note"]
    assert run.status("cleanup") == "passed"
    assert run.status("other") == "passed"
    assert not (run.state / "work" / "publish").exists()  # never staged, never started


def test_conditions_read_params_inputs_and_need_statuses(tmp_path: Path) -> None:
    body = (
        task(
            "build",
            emit({"version": "1.2", "size": 3}),
            emits={"version": "string", "size": "integer"},
        )
        + """
[workflow.params.publish]
type = "boolean"
default = false
"""
        + task(
            "publish",
            OK,
            needs=["build"],
            inputs={"version": "build.version", "size": "build.size"},
            when="params.publish and inputs.version.startswith('1.') and inputs.size > 2",
        )
        + task("gate", OK, needs=["build"], join="settled", when="needs.build.status == 'passed'")
    )
    off = dispatch(tmp_path, body, name="off")
    on = dispatch(tmp_path, body, "-p", "publish=true", name="on")
    assert off.code == on.code == 0
    assert off.status("publish") == "skipped" and on.status("publish") == "passed"
    assert off.status("gate") == on.status("gate") == "passed"


def test_a_mapped_task_decides_per_item(tmp_path: Path) -> None:
    items = [{"name": "a", "big": True}, {"name": "b", "big": False}, {"name": "c", "big": True}]
    run = dispatch(
        tmp_path,
        task("list", emit({"items": items}), emits={"items": "array"})
        + task("each", OK, needs=["list"], map="list.items", when="item.big and item.name != 'c'")
        + task("after", OK, needs=["each"]),
    )
    assert run.code == 0, run.stderr
    assert [run.record("each", k)["status"] for k in ("0", "1", "2")] == [
        "passed",
        "skipped",
        "skipped",
    ]
    assert run.record("each", "1")["note"].startswith("condition false: item.big")
    aggregate = run.record("each")
    assert aggregate["status"] == "passed" and "2 skipped by their condition" in aggregate["note"]
    assert run.status("after") == "passed"


def test_a_mapped_task_whose_every_item_is_skipped_is_skipped(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task("list", emit({"items": [1, 2]}), emits={"items": "array"})
        + task("each", OK, needs=["list"], map="list.items", when="item > 5")
        + task("after", OK, needs=["each"]),
    )
    assert run.code == 0, run.stderr
    assert run.status("each") == "skipped" and run.status("after") == "skipped"


def test_a_condition_that_fails_to_evaluate_fails_the_unit_with_the_expression(
    tmp_path: Path,
) -> None:
    run = dispatch(
        tmp_path,
        task("build", emit({"n": 3}), emits={"n": "integer"})
        + task("use", OK, needs=["build"], inputs={"n": "build.n"}, when="inputs.n + 'x' == 'y'")
        + task("num", OK, when="len('abc')"),
    )
    assert run.code == 1
    record = run.record("use")
    assert record["status"] == "failed"
    assert record["note"].startswith("condition error: inputs.n + 'x' == 'y': ")
    assert "not supported" in record["note"]
    assert "must be true or false, not int" in run.record("num")["note"]


# -- status triggers -------------------------------------------------------------


TRIGGERS = (
    task("build", "exit $BUILD_EXIT", env=["BUILD_EXIT"])
    + task("on_pass", OK, needs=["build"])
    + task("on_fail", OK, needs=["build"], join="settled", when="needs.build.status == 'failed'")
    + task("always", OK, needs=["build"], join="settled")
    + task(
        "not_skipped",
        OK,
        needs=["on_pass"],
        join="settled",
        when="needs.on_pass.status != 'skipped'",
    )
)


def _triggers(tmp_path: Path, build_exit: int) -> Run:
    pack = tmp_path / f"t{build_exit}.toml"
    pack.write_text(textwrap.dedent(HEAD) + TRIGGERS)
    state = tmp_path / f"t{build_exit}-state"
    proc = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "BUILD_EXIT": str(build_exit)},
    )
    return Run(proc.returncode, proc.stderr, state)


def test_each_trigger_of_the_table(tmp_path: Path) -> None:
    passed, failed = _triggers(tmp_path, 0), _triggers(tmp_path, 1)
    assert passed.code == 0 and failed.code == 1
    assert {t: passed.status(t) for t in ("on_pass", "on_fail", "always", "not_skipped")} == {
        "on_pass": "passed",
        "on_fail": "skipped",
        "always": "passed",
        "not_skipped": "passed",
    }
    assert {t: failed.status(t) for t in ("on_pass", "on_fail", "always", "not_skipped")} == {
        "on_pass": "skipped",
        "on_fail": "passed",
        "always": "passed",
        "not_skipped": "skipped",
    }


def test_counts_of_a_mapped_need_give_any_and_all_triggers(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task("list", emit({"items": [0, 1, 2]}), emits={"items": "array"})
        + task("each", 'test "$CRUCIBLE_KEY" != 1', needs=["list"], map="list.items")
        + task(
            "any_passed", OK, needs=["each"], join="settled", when="needs.each.counts['passed'] > 0"
        )
        + task(
            "all_failed",
            OK,
            needs=["each"],
            join="settled",
            when="needs.each.counts['failed'] == needs.each.counts['passed'] + 3",
        ),
    )
    assert run.code == 1  # an instance failed, untolerated
    assert run.status("any_passed") == "passed"
    assert run.status("all_failed") == "skipped"


# -- tolerated failure ---------------------------------------------------------------


def test_a_tolerated_failure_leaves_the_run_passed_and_shows_everywhere(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task("enrich", "exit 7", on_failure="continue")
        + task("use", OK, needs=["enrich"])
        + task("look", OK, needs=["enrich"], join="settled", when="needs.enrich.status == 'failed'")
        + task("summary", 'cp "$CRUCIBLE_INPUTS_DIR/outcome" outcome.json', epilogue=True),
    )
    assert run.code == 0, run.stderr
    record = run.record("enrich")
    assert record["status"] == "failed" and record["tolerated"] is True
    (event,) = run.finished("enrich")
    assert event["tolerated"] is True and event["exit_code"] == 7
    assert run.status("use") == "skipped"  # consumers see a failed producer
    assert run.status("look") == "passed"
    outcome = json.loads((run.state / "work" / "summary" / "outcome.json").read_text())
    assert outcome["status"] == "passed"
    assert outcome["tasks"]["enrich"]["status"] == "failed"
    assert outcome["tasks"]["enrich"]["tolerated"] is True
    final = [e for e in run.events if e["event"] == "run_finished"][-1]
    assert final["status"] == "passed" and final["counts"]["tolerated"] == 1


def test_allow_exit_tolerates_only_the_listed_codes(tmp_path: Path) -> None:
    listed = dispatch(tmp_path, task("t", "exit 3", allow_exit=[3, 4]), name="listed")
    other = dispatch(tmp_path, task("t", "exit 5", allow_exit=[3, 4]), name="other")
    timeout = dispatch(tmp_path, task("t", "sleep 5", allow_exit=[3], timeout=0.3), name="slow")
    assert listed.code == 0 and listed.record("t").get("tolerated") is True
    assert other.code == 1 and "tolerated" not in other.record("t")
    assert timeout.code == 1 and "tolerated" not in timeout.record("t")


def test_a_mapped_task_with_tolerated_instances_is_tolerated(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task("list", emit({"items": [0, 1, 2]}), emits={"items": "array"})
        + task(
            "each",
            'test "$CRUCIBLE_KEY" != 1',
            needs=["list"],
            map="list.items",
            on_failure="continue",
        ),
    )
    assert run.code == 0, run.stderr
    assert run.record("each", "1")["tolerated"] is True
    assert run.record("each")["status"] == "failed" and run.record("each")["tolerated"] is True


def test_retries_come_before_tolerance(tmp_path: Path) -> None:
    run = dispatch(tmp_path, task("t", FAIL, on_failure="continue", retry={"limit": 2, "delay": 0}))
    assert run.code == 0
    assert [e["attempt"] for e in run.finished("t")] == [1, 2, 3]
    assert run.finished("t")[-1]["tolerated"] is True


# -- retry policy ---------------------------------------------------------------------


def _times(run: Run, name: str) -> list[float]:
    return [float(t) for t in (run.state / "work" / name / "times").read_text().split()]


def test_retry_backs_off_by_delay_times_factor(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task(
            "flaky",
            'date +%s.%N >> times; echo "$CRUCIBLE_ATTEMPT $CRUCIBLE_LAST_EXIT $CRUCIBLE_LAST_REASON" >> env; exit 3',
            retry={"limit": 2, "delay": 0.4, "factor": 2},
        ),
    )
    assert run.code == 1
    times = _times(run, "flaky")
    assert len(times) == 3
    first, second = times[1] - times[0], times[2] - times[1]
    # lower bounds are the policy; the upper ones only say the delay did not run away
    # (the machine may be loaded)
    assert 0.4 <= first < 10 and 0.8 <= second < 10, (first, second)
    env = (run.state / "work" / "flaky" / "env").read_text().splitlines()
    assert env == ["1  ", "2 3 exit", "3 3 exit"]


def test_max_delay_caps_the_backoff(tmp_path: Path) -> None:
    policy = {"limit": 2, "delay": 0.3, "factor": 100, "max_delay": 0.4}
    run = dispatch(tmp_path, task("flaky", "date +%s.%N >> times; exit 1", retry=policy))
    times = _times(run, "flaky")
    assert 0.4 <= times[2] - times[1] < 15  # uncapped it would be 30 s


def test_on_exit_retries_only_the_listed_codes(tmp_path: Path) -> None:
    listed = dispatch(
        tmp_path, task("t", "exit 75", retry={"limit": 2, "delay": 0, "on_exit": [75]}), name="a"
    )
    other = dispatch(
        tmp_path, task("t", "exit 1", retry={"limit": 2, "delay": 0, "on_exit": [75]}), name="b"
    )
    assert [e["attempt"] for e in listed.finished("t")] == [1, 2, 3]
    assert [e["attempt"] for e in other.finished("t")] == [1]
    assert "no retry: exit code 1 is not in on_exit" in other.record("t")["note"]


def test_on_timeout_false_does_not_retry_a_timeout(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task("t", "sleep 5", timeout=0.2, retry={"limit": 3, "delay": 0, "on_timeout": False}),
    )
    assert [e["attempt"] for e in run.finished("t")] == [1]
    assert "on_timeout is false" in run.record("t")["note"]


def test_timeout_reason_reaches_the_next_attempt(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task(
            "t",
            'echo "$CRUCIBLE_LAST_REASON" >> reasons; test "$CRUCIBLE_ATTEMPT" = 2 || sleep 5',
            timeout=0.3,
            retry={"limit": 1, "delay": 0},
        ),
    )
    assert run.code == 0, run.stderr
    assert (run.state / "work" / "t" / "reasons").read_text().splitlines() == ["", "timeout"]


def test_a_deadline_stops_retrying(tmp_path: Path) -> None:
    policy = {"limit": 50, "delay": 0.5, "factor": 1}
    run = dispatch(tmp_path, task("t", "date +%s.%N >> times; exit 1", retry=policy, deadline=3))
    assert run.code == 1
    times = _times(run, "t")
    assert 2 <= len(times) <= 7, times  # 51 attempts without the deadline
    assert times[-1] - times[0] < 3 + 2  # (start-up latency on a loaded machine)
    assert "the deadline of 3 s is reached" in run.record("t")["note"]


# -- epilogues as a DAG -----------------------------------------------------------------


def test_epilogues_chain_map_and_test_the_run_status(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task("build", FAIL)
        + task("channels", emit({"to": ["mail", "chat"]}), emits={"to": "array"})
        + task("collect", "date +%s.%N > t", epilogue=True, emits_files=["t"])
        + task(
            "notify",
            "date +%s.%N > t",
            epilogue=True,
            needs=["collect", "channels"],
            map="channels.to",
            when="outcome.status == 'failed'",
        )
        + task("celebrate", OK, epilogue=True, when="outcome.status == 'passed'"),
    )
    assert run.code == 1
    assert run.status("collect") == "passed"
    assert [run.record("notify", k)["status"] for k in ("0", "1")] == ["passed", "passed"]
    assert run.status("celebrate") == "skipped"
    assert run.record("celebrate")["note"] == "condition false: outcome.status == 'passed'"
    collected = float((run.state / "files" / "collect" / "t").read_text())  # captured: moved to the store
    notified = min(float((run.state / "work" / "notify" / k / "t").read_text()) for k in ("0", "1"))
    assert collected <= notified  # notify needs collect


def test_an_epilogue_chain_follows_its_join(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task("work", OK)
        + task("first", FAIL, epilogue=True)
        + task("second", OK, epilogue=True, needs=["first"])
        + task("third", OK, epilogue=True, needs=["first"], join="settled"),
    )
    assert run.code == 1
    assert run.status("second") == "skipped" and run.status("third") == "passed"


def test_a_resumed_run_still_ignores_a_tolerated_failure(tmp_path: Path) -> None:
    import signal
    import time

    pack = tmp_path / "pack.toml"
    pack.write_text(
        textwrap.dedent(HEAD)
        + task("enrich", "exit 7", on_failure="continue")
        + task(
            "slow", "test -f again || { touch again; sleep 30; }", needs=["enrich"], join="settled"
        )
    )
    state = tmp_path / "state"
    proc = start_dispatch(pack, state)
    run = Run(0, "", state)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        log = state / "session.jsonl"
        if log.exists() and any(
            e["event"] == "task_started" and e["task"] == "slow" for e in run.events
        ):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 143
    resumed = subprocess.run(
        [DISPATCH, str(pack), "--state", str(state), "--resume"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert resumed.returncode == 0, resumed.stderr
    final = [e for e in run.events if e["event"] == "run_finished"][-1]
    assert final["status"] == "passed" and final["counts"]["tolerated"] == 1


def test_control_events_and_records_match_their_schemas(tmp_path: Path) -> None:
    import pytest

    jsonschema = pytest.importorskip("jsonschema")
    schemas = Path(__file__).resolve().parents[2] / "docs" / "schemas"
    run = dispatch(
        tmp_path,
        task("list", emit({"items": [0, 1]}), emits={"items": "array"})
        + task(
            "each",
            'test "$CRUCIBLE_KEY" = 0',
            needs=["list"],
            map="list.items",
            on_failure="continue",
        )
        + task("skip", OK, when="item == 1", needs=["list"], map="list.items")
        + task("flaky", FAIL, retry={"limit": 1, "delay": 0}, allow_exit=[1]),
    )
    assert run.code == 0, run.stderr
    events = jsonschema.Draft202012Validator(
        json.loads((schemas / "session-event.json").read_text())
    )
    for event in run.events:
        events.validate(event)
    records = jsonschema.Draft202012Validator(
        json.loads((schemas / "result-record.json").read_text())
    )
    for path in (run.state / "results").rglob("*.json"):
        records.validate(json.loads(path.read_bytes()))


def test_fail_fast_ignores_a_tolerated_failure_and_stops_at_a_condition_error(
    tmp_path: Path,
) -> None:
    tolerated = dispatch(
        tmp_path,
        task("enrich", "exit 7", on_failure="continue")
        + task("later", OK, needs=["enrich"], join="settled"),
        "--fail-fast",
        "-j",
        "1",
        name="tolerated",
    )
    assert tolerated.code == 0, tolerated.stderr
    assert tolerated.status("later") == "passed"
    broken = dispatch(
        tmp_path,
        task("bad", OK, when="1 + 'x'") + task("slow", "sleep 20"),
        "--fail-fast",
        name="broken",
    )
    assert broken.code == 1
    assert "bad" in broken.stderr
    assert broken.status("bad") == "failed"


def test_a_target_whose_ancestor_failed_tolerated_passes(tmp_path: Path) -> None:
    run = dispatch(
        tmp_path,
        task("enrich", "exit 7", on_failure="continue")
        + task("load", OK, needs=["enrich"], join="settled")
        + task("unrelated", OK),
        "--target",
        "load",
    )
    assert run.code == 0, run.stderr  # `unrelated` is not selected, not unsettled
    assert run.status("load") == "passed"
