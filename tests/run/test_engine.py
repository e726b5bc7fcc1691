"""End-to-end runs through run_plan: real task processes, real state dirs."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from crucible.core import canon
from crucible.core.errors import InputRefused, PlanChanged, UsageError
from crucible.run import RunOptions
from crucible.run.session._runner import run_plan  # typed (crucible.run loads it lazily)
from tests.run.dispatchtests import Pack, events, process_alive, result, run


def test_parallel_tasks_overlap_and_j1_serialises(pack: Pack, tmp_path: Path) -> None:
    body = "".join(
        f"""
[[workflow.task]]
name = "s{i}"
emits = {{ start = "number", end = "number" }}
run = '''s=$(date +%s.%N); sleep 0.4; e=$(date +%s.%N); printf '{{"start": %s, "end": %s}}' $s $e > "$CRUCIBLE_OUTPUT"'''
"""
        for i in range(3)
    )
    plan = pack(body)

    def spans(state: Path) -> list[tuple[float, float]]:
        out = []
        for i in range(3):
            rec = result(state, f"s{i}")
            assert rec is not None and rec["status"] == "passed", rec
            out.append((rec["output"]["start"], rec["output"]["end"]))
        return out

    outcome = run(plan, tmp_path / "par", jobs=3)
    assert outcome.exit_code == 0  # type: ignore[attr-defined]
    par = spans(tmp_path / "par")
    assert max(s for s, _ in par) < min(e for _, e in par), f"no overlap at -j 3: {par}"
    run(plan, tmp_path / "ser", jobs=1)
    ser = sorted(spans(tmp_path / "ser"))
    for (_, end), (start, _) in itertools.pairwise(ser):
        assert start >= end, f"overlap at -j 1: {ser}"


def test_dependency_order_join_all_skip_and_settled(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "ok"
emits = { n = "integer" }
run = 'echo "{\\"n\\": 1}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "bad"
emits = { n = "integer" }
run = 'echo "{\\"n\\": 2}" > "$CRUCIBLE_OUTPUT"; exit 3'

[[workflow.task]]
name = "after_bad"
needs = ["ok", "bad"]
run = "true"

[[workflow.task]]
name = "after_skip"
needs = ["after_bad"]
run = "true"

[[workflow.task]]
name = "settled"
needs = ["ok", "bad"]
join = "settled"
inputs = { a = "ok.n", b = "bad.n" }
emits = { seen = "array" }
run = '''cat "$CRUCIBLE_INPUTS_DIR/index.json" > seen.json; printf '{"seen": [%s, %s]}' "$(cat $CRUCIBLE_INPUTS_DIR/a)" "$(cat $CRUCIBLE_INPUTS_DIR/b)" > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "end"
epilogue = true
emits = { tasks = "array" }
run = '''python3 -c 'import json,os; o=json.load(open(os.environ["CRUCIBLE_INPUTS_DIR"]+"/outcome")); json.dump({"tasks": sorted(o["tasks"])}, open(os.environ["CRUCIBLE_OUTPUT"],"w"))' '''
"""
    )
    state = tmp_path / "s"
    outcome = run(plan, state, jobs=2)
    assert outcome.exit_code == 1  # type: ignore[attr-defined]
    bad = result(state, "bad")
    assert bad is not None and bad["status"] == "failed" and "exited with status 3" in bad["note"]
    skipped = result(state, "after_bad")
    assert skipped is not None and skipped["status"] == "skipped"
    assert skipped["note"] == "skipped: needs 'bad', which failed"
    chained = result(state, "after_skip")
    assert (
        chained is not None and chained["note"] == "skipped: needs 'after_bad', which was skipped"
    )
    settled = result(state, "settled")
    assert settled is not None and settled["status"] == "passed"
    assert settled["output"]["seen"] == [1, 2]  # the failed producer's retained field is staged
    end = result(state, "end")
    assert end is not None and end["status"] == "passed"
    assert end["output"]["tasks"] == ["after_bad", "after_skip", "bad", "ok", "settled"]
    evs = events(state)
    started = [e["task"] for e in evs if e["event"] == "task_started"]
    assert started[-1] == "end"  # the epilogue runs after everything else settled
    assert "after_bad" not in started and "after_skip" not in started
    assert [e["event"] for e in evs][-2:] == ["run_finished", "shutdown"]


def test_timeout_kills_the_whole_group(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "hang"
timeout = 0.5
run = 'sleep 60 & echo $! > gc.pid; sh -c "sleep 60" & echo $! >> gc.pid; wait'
"""
    )
    state = tmp_path / "s"
    t = time.monotonic()
    outcome = run(plan, state)
    assert time.monotonic() - t < 10
    assert outcome.exit_code == 1  # type: ignore[attr-defined]
    rec = result(state, "hang")
    assert (
        rec is not None
        and rec["status"] == "failed"
        and rec["note"] == "killed by SIGTERM after timeout 0.5s"
    )
    pids = [int(p) for p in (state / "work" / "hang" / "gc.pid").read_text().split()]
    assert len(pids) == 2
    for pid in pids:
        assert not process_alive(pid), f"grandchild {pid} survived the timeout"


def test_retries_keep_workspace_fresh_output_and_count_attempts(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "flaky"
retries = 3
emits = { attempt = "integer", seen = "integer" }
run = '''
test ! -e "$CRUCIBLE_OUTPUT" || exit 9
echo "$CRUCIBLE_ATTEMPT" >> attempts.txt
if [ "$CRUCIBLE_ATTEMPT" -lt 3 ]; then exit 1; fi
printf '{"attempt": %s, "seen": %s}' "$CRUCIBLE_ATTEMPT" "$(wc -l < attempts.txt)" > "$CRUCIBLE_OUTPUT"
'''
"""
    )
    state = tmp_path / "s"
    assert run(plan, state).exit_code == 0  # type: ignore[attr-defined]
    rec = result(state, "flaky")
    assert rec is not None and rec["output"] == {
        "attempt": 3,
        "seen": 3,
    }  # workspace kept across attempts
    finished = [e for e in events(state) if e["event"] == "task_finished"]
    assert [(e["attempt"], e["status"], e.get("retry", False)) for e in finished] == [
        (1, "failed", True),
        (2, "failed", True),
        (3, "passed", False),
    ]


def test_over_cap_is_a_measured_failure_never_retried(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "big"
retries = 3
emits = { blob = "string" }
run = '''python3 -c 'import json,os; json.dump({"blob": "x" * 5000}, open(os.environ["CRUCIBLE_OUTPUT"], "w"))' '''
"""
    )
    state = tmp_path / "s"
    assert run(plan, state, emit_cap=1000).exit_code == 1  # type: ignore[attr-defined]
    rec = result(state, "big")
    assert rec is not None and rec["status"] == "failed" and "emits_files" in rec["note"]
    assert sum(1 for e in events(state) if e["event"] == "task_started") == 1


def test_evaluate_verdict(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "good"
kind = "evaluate"
run = '''echo '{"verdict": "pass"}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "bad"
kind = "evaluate"
retries = 2
emits = { score = "number" }
run = '''echo '{"verdict": "fail", "reason": "score too low", "score": 0.2}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "none"
kind = "evaluate"
run = '''echo '{}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "look"
needs = ["bad"]
join = "settled"
inputs = { score = "bad.score" }
run = '''test "$(cat $CRUCIBLE_INPUTS_DIR/score)" = "0.2"'''
"""
    )
    state = tmp_path / "s"
    assert run(plan, state).exit_code == 1  # type: ignore[attr-defined]
    assert result(state, "good")["status"] == "passed"  # type: ignore[index]
    bad = result(state, "bad")
    assert (
        bad is not None
        and bad["status"] == "failed"
        and bad["note"] == "verdict: fail: score too low"
    )
    assert bad["extra"]["verdict"] == "fail" and bad["output"]["score"] == 0.2
    assert sum(1 for e in events(state) if e["event"] == "task_started" and e["task"] == "bad") == 1
    none = result(state, "none")
    assert none is not None and none["status"] == "failed" and 'no "verdict"' in none["note"]
    assert result(state, "look")["status"] == "passed"  # type: ignore[index]


def test_agent_gets_prompt_by_file_and_env_never_argv_never_params(
    pack: Pack, tmp_path: Path
) -> None:
    stand_in = tmp_path / "agent.sh"
    stand_in.write_text(
        "#!/bin/sh\n"
        'echo "$@" > argv.txt\n'
        'cp "$CRUCIBLE_PROMPT_FILE" prompt.txt\n'
        'printf %s "${CRUCIBLE_PROMPT-UNSET}" > prompt_env.txt\n'
        'ls "$CRUCIBLE_INPUTS_DIR" > inputs.txt\n'
        "env > env.txt\n"
        'echo "{}" > "$CRUCIBLE_OUTPUT"\n'
    )
    stand_in.chmod(0o755)
    big = "B" * 70000
    plan = pack(
        f"""
[workflow.params.secret]
type = "string"
default = "hunter2"

[[workflow.task]]
name = "small"
kind = "agent"
prompt = "Say hello."

[[workflow.task]]
name = "large"
kind = "agent"
prompt = "{big}"
"""
    )
    state = tmp_path / "s"
    assert run(plan, state, agent_cmd=str(stand_in)).exit_code == 0  # type: ignore[attr-defined]
    small = state / "work" / "small"
    assert (small / "argv.txt").read_text().strip() == ""
    assert "Say hello." in (small / "prompt.txt").read_text()
    assert (small / "prompt_env.txt").read_text() == (small / "prompt.txt").read_text()
    assert "params" not in (small / "inputs.txt").read_text().split()
    assert "hunter2" not in (small / "env.txt").read_text()
    large = state / "work" / "large"
    assert big in (large / "prompt.txt").read_text()
    assert (large / "prompt_env.txt").read_text() == "UNSET"  # over 64 KiB: file only


def test_agent_prompt_with_nul_goes_by_file_only(pack: Pack, tmp_path: Path) -> None:
    # An environment value cannot carry NUL: execve would refuse the launch.
    stand_in = tmp_path / "agent.sh"
    stand_in.write_text(
        "#!/bin/sh\n"
        'cp "$CRUCIBLE_PROMPT_FILE" prompt.txt\n'
        'printf %s "${CRUCIBLE_PROMPT-UNSET}" > prompt_env.txt\n'
        'echo "{}" > "$CRUCIBLE_OUTPUT"\n'
    )
    stand_in.chmod(0o755)
    plan = pack(
        """
[[workflow.task]]
name = "nul"
kind = "agent"
prompt = "before\\u0000after"
"""
    )
    state = tmp_path / "s"
    assert run(plan, state, agent_cmd=str(stand_in)).exit_code == 0  # type: ignore[attr-defined]
    work = state / "work" / "nul"
    assert b"before\x00after" in (work / "prompt.txt").read_bytes()
    assert (work / "prompt_env.txt").read_text() == "UNSET"


def test_environment_policy_end_to_end(pack: Pack, tmp_path: Path) -> None:
    body = """
[[workflow.task]]
name = "env"
{env}
run = 'env > "$CRUCIBLE_WORKSPACE/env.txt"'
"""
    for edition, declared, expect_secret in (
        (1, "", True),
        (3, "", False),
        (3, 'env = ["SECRET"]', True),
    ):
        plan = pack(body.format(env=declared), edition=edition, where=f"p{edition}{bool(declared)}")
        state = tmp_path / f"s{edition}{bool(declared)}"
        assert run(plan, state).exit_code == 0  # type: ignore[attr-defined]
        seen = dict(
            line.split("=", 1)
            for line in (state / "work/env/env.txt").read_text().splitlines()
            if "=" in line
        )
        assert ("SECRET" in seen) is expect_secret, (edition, declared)
        if edition >= 2:
            assert "HOME" not in seen
        assert seen["CRUCIBLE_TASK"] == "env" and seen["CRUCIBLE_ATTEMPT"] == "1"


def test_fanout_fold_and_empty_map(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[workflow.params.items]
type = "array"
default = ["a", "b/../c", ".hidden"]

[[workflow.task]]
name = "src"
emits = { items = "array" }
run = '''python3 -c 'import json,os; p=json.load(open(os.environ["CRUCIBLE_INPUTS_DIR"]+"/params")); json.dump({"items": p["items"]}, open(os.environ["CRUCIBLE_OUTPUT"],"w"))' '''

[[workflow.task]]
name = "each"
needs = ["src"]
map = "src.items"
emits = { up = "string" }
run = '''python3 -c 'import json,os; i=json.load(open(os.environ["CRUCIBLE_INPUTS_DIR"]+"/item")); json.dump({"up": i.upper() + os.environ["CRUCIBLE_KEY"]}, open(os.environ["CRUCIBLE_OUTPUT"],"w"))' '''

[[workflow.task]]
name = "fold"
needs = ["each"]
inputs = { ups = "each.up" }
emits = { n = "integer" }
run = '''printf '{"n": %s}' "$(ls "$CRUCIBLE_INPUTS_DIR/ups" | wc -l)" > "$CRUCIBLE_OUTPUT"'''
"""
    )
    state = tmp_path / "s"
    assert run(plan, state).exit_code == 0  # type: ignore[attr-defined]
    assert result(state, "each", "1")["output"]["up"] == "B/../C1"  # type: ignore[index]
    assert result(state, "fold")["output"]["n"] == 3  # type: ignore[index]
    agg = result(state, "each")
    assert agg is not None and agg["keys"] == ["0", "1", "2"]
    # An empty map: no instance runs, the task passes with zero instances, consumers run on an empty fold.
    empty_params = tmp_path / "empty.json"
    empty_params.write_text('{"items": []}')
    state2 = tmp_path / "s2"
    assert run(plan, state2, params_file=str(empty_params)).exit_code == 0  # type: ignore[attr-defined]
    agg2 = result(state2, "each")
    assert agg2 is not None and agg2["status"] == "passed" and agg2["keys"] == []
    assert result(state2, "fold")["output"]["n"] == 0  # type: ignore[index]
    assert not [e for e in events(state2) if e["event"] == "task_started" and e["task"] == "each"]


def test_resume_reruns_only_unsettled_and_refuses_a_changed_plan(
    pack: Pack, tmp_path: Path
) -> None:
    body = """
[[workflow.task]]
name = "a"
run = 'echo a >> "$CRUCIBLE_WORKSPACE/../../runs.txt"'

[[workflow.task]]
name = "b"
needs = ["a"]
run = 'echo b >> "$CRUCIBLE_WORKSPACE/../../runs.txt"'
"""
    plan = pack(body)
    state = tmp_path / "s"
    assert run(plan, state).exit_code == 0  # type: ignore[attr-defined]
    # Forget b's result, as if the run had been interrupted before b settled.
    (state / "results" / "b.json").unlink()
    assert run(plan, state, resume=True).exit_code == 0  # type: ignore[attr-defined]
    assert (state / "runs.txt").read_text().split() == ["a", "b", "b"]
    sessions = [e["session"] for e in events(state) if e["event"] == "plan_admitted"]
    assert sessions == [1, 2]
    changed = pack(body + '\n[[workflow.task]]\nname = "c"\nrun = "true"\n', where="changed")
    with pytest.raises(PlanChanged) as err:
        run(changed, state, resume=True)
    admitted = canon.loads((state / "plan.json").read_bytes())
    assert admitted["tasks"][-1]["name"] == "b"
    assert str(err.value).count("sha256:") == 2
    with pytest.raises(InputRefused, match="another plan"):
        run(changed, state)
    with pytest.raises(InputRefused, match="--resume"):
        run(plan, state)
    with pytest.raises(InputRefused, match="nothing to resume"):
        run(plan, tmp_path / "fresh", resume=True)


def test_bad_input_is_refused_before_anything_runs(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        '[workflow.params.n]\ntype = "integer"\n\n[[workflow.task]]\nname = "a"\nrun = "true"\n'
    )
    with pytest.raises(InputRefused, match="required"):
        run(plan, tmp_path / "s1")
    with pytest.raises(InputRefused, match="must be an integer, not a boolean"):
        run(plan, tmp_path / "s2", params=("n=true",))
    with pytest.raises(UsageError, match="no such plan"):
        run(tmp_path / "missing.toml", tmp_path / "s3")
    agent = pack('[[workflow.task]]\nname = "a"\nkind = "agent"\nprompt = "hi"\n', where="agent")
    with pytest.raises(UsageError, match="--agent-cmd"):
        run(agent, tmp_path / "s4")
    for s in ("s1", "s2", "s3", "s4"):
        assert not (tmp_path / s / "plan.json").exists()


def _check_schema(schema: dict[str, object], value: object, where: str) -> None:
    """The subset of JSON Schema the session-event schema uses."""
    assert isinstance(schema, dict)
    kind = schema.get("type")
    types = {
        "object": dict,
        "array": list,
        "string": str,
        "boolean": bool,
        "integer": int,
        "number": (int, float),
    }
    if isinstance(kind, str):
        assert isinstance(value, types[kind]), f"{where}: {value!r} is not {kind}"  # type: ignore[arg-type]
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"  # type: ignore[operator]
    if "const" in schema:
        assert value == schema["const"], where
    if isinstance(value, dict):
        for name in schema.get("required", []):  # type: ignore[attr-defined]
            assert name in value, f"{where}: missing {name}"
        props = schema.get("properties", {})
        assert isinstance(props, dict)
        for name, item in value.items():
            if name in props:
                _check_schema(props[name], item, f"{where}.{name}")
            elif schema.get("additionalProperties") is False:
                raise AssertionError(f"{where}: unexpected {name}")
            elif isinstance(schema.get("additionalProperties"), dict):
                _check_schema(schema["additionalProperties"], item, f"{where}.{name}")  # type: ignore[arg-type]
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check_schema(schema["items"], item, f"{where}[{i}]")  # type: ignore[arg-type]
    for branch in schema.get("allOf", []):  # type: ignore[attr-defined]
        cond = branch["if"]["properties"]["event"]["const"]
        if isinstance(value, dict) and value.get("event") == cond:
            _check_schema(branch["then"], value, where)


def test_every_event_matches_the_session_event_schema(pack: Pack, tmp_path: Path) -> None:
    import json

    schema = json.loads(
        (Path(__file__).resolve().parents[2] / "docs/schemas/session-event.json").read_text()
    )
    plan = pack(
        """
[[workflow.task]]
name = "src"
emits = { xs = "array" }
run = '''echo '{"xs": [1, 2]}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "each"
needs = ["src"]
map = "src.xs"
emits_files = ["f.txt"]
run = 'echo hi > f.txt; test "$CRUCIBLE_KEY" = 0'

[[workflow.task]]
name = "after"
needs = ["each"]
run = "true"

[[workflow.task]]
name = "retry"
retries = 1
run = "exit 1"
"""
    )
    state = tmp_path / "s"
    run(plan, state, jobs=2)
    evs = events(state)
    kinds = {e["event"] for e in evs}
    assert kinds == {"plan_admitted", "task_started", "task_finished", "run_finished", "shutdown"}
    for i, event in enumerate(evs):
        _check_schema(schema, event, f"event {i}")
    assert any(e.get("retry") for e in evs)
    assert any(e.get("files_bytes") == 3 for e in evs)
    admitted = evs[0]
    assert [t["name"] for t in admitted["tasks"]] == ["src", "each", "after", "retry"]
    assert admitted["plan_version"] == 2 and admitted["digest"].startswith("sha256:")


def test_interrupt_during_retry_backoff_leaves_the_unit_unsettled(
    pack: Pack, tmp_path: Path
) -> None:
    import signal
    import threading

    plan = pack('[[workflow.task]]\nname = "flaky"\nretries = 2\nrun = "exit 1"\n')
    state = tmp_path / "s"
    options = RunOptions(plan=plan, state=state, backoff=5.0, kill_grace=1.0)

    def interrupt() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            log = state / "session.jsonl"
            if log.exists() and b'"retry":true' in log.read_bytes():
                os.kill(os.getpid(), signal.SIGINT)
                return
            time.sleep(0.02)

    threading.Thread(target=interrupt, daemon=True).start()
    from crucible.core.errors import Interrupted

    with pytest.raises(Interrupted) as err:
        run_plan(options, environ={"PATH": os.environ["PATH"]})
    assert err.value.exit_code == 130
    assert result(state, "flaky") is None  # unsettled: a resume runs it again
    evs = events(state)
    assert evs[-1]["event"] == "shutdown" and evs[-1]["signal"] == "SIGINT"
    assert evs[-2]["event"] == "run_finished" and evs[-2]["status"] == "interrupted"


def test_mapped_consumers_of_a_failed_producer_and_long_keys(pack: Pack, tmp_path: Path) -> None:
    plan = pack(
        """
[[workflow.task]]
name = "src"
emits = { xs = "array", ys = "object" }
run = '''python3 -c 'import json,os; json.dump({"xs": [1], "ys": {"k" * 300: 1, "../x": 2}}, open(os.environ["CRUCIBLE_OUTPUT"],"w"))'; exit 1'''

[[workflow.task]]
name = "all"
needs = ["src"]
map = "src.xs"
run = "true"

[[workflow.task]]
name = "settled"
needs = ["src"]
join = "settled"
map = "src.xs"
run = "true"

[[workflow.task]]
name = "ok"
emits = { ys = "object" }
run = '''python3 -c 'import json,os; json.dump({"ys": {"k" * 300: 1, "../x": 2}}, open(os.environ["CRUCIBLE_OUTPUT"],"w"))' '''

[[workflow.task]]
name = "agent"
kind = "agent"
needs = ["ok"]
map = "ok.ys"
prompt = "hi"
"""
    )
    stand_in = tmp_path / "a.sh"
    stand_in.write_text(
        '#!/bin/sh\ntest -s "$CRUCIBLE_PROMPT_FILE" && echo "{}" > "$CRUCIBLE_OUTPUT"\n'
    )
    stand_in.chmod(0o755)
    state = tmp_path / "s"
    assert run(plan, state, agent_cmd=str(stand_in)).exit_code == 1  # type: ignore[attr-defined]
    skipped = result(state, "all")
    assert skipped is not None and skipped["status"] == "skipped" and skipped["keys"] == []
    assert skipped["note"] == "skipped: needs 'src', which failed"
    failed = result(state, "settled")
    assert failed is not None and failed["status"] == "failed" and "map source" in failed["note"]
    agent = result(state, "agent")
    assert agent is not None and agent["status"] == "passed", agent
    assert sorted(agent["keys"]) == sorted(["k" * 300, "../x"])
    assert not (state.parent / "x").exists()


def test_relative_state_dir(pack: Pack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = pack(
        '[[workflow.task]]\nname = "a"\nemits = { n = "integer" }\n'
        'run = """echo \'{\\"n\\": 1}\' > \\"$CRUCIBLE_OUTPUT\\""""\n'
    )
    monkeypatch.chdir(tmp_path)
    assert run(plan, Path("rel/state")).exit_code == 0  # type: ignore[attr-defined]
    assert result(tmp_path / "rel/state", "a")["output"] == {"n": 1}  # type: ignore[index]


def test_events_file_mirrors_the_log(pack: Pack, tmp_path: Path) -> None:
    plan = pack('[[workflow.task]]\nname = "a"\nrun = "true"\n')
    state = tmp_path / "s"
    mirror = tmp_path / "events.ndjson"
    assert run(plan, state, events=str(mirror)).exit_code == 0  # type: ignore[attr-defined]
    assert mirror.read_bytes() == (state / "session.jsonl").read_bytes()
    assert (
        mirror.read_bytes().count(b"\n") == 5
    )  # admitted, started, finished, run_finished, shutdown


def test_a_refusal_a_worker_did_not_expect_fails_the_unit_not_the_run(
    pack: Pack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CrucibleError escaping a worker's unit (outside staging, start and
    capture, which report their own) settles that unit as failed, with its
    message; the run goes on."""
    from crucible.run.executors import _unit as unit_module

    real = unit_module.UnitRunner._environment

    def refuse_one(self: object, task: dict[str, object], name: str, *a: object) -> object:
        if name == "bad":
            raise InputRefused("refused for the test")
        return real(self, task, name, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(unit_module.UnitRunner, "_environment", refuse_one)
    plan = pack(
        """
[[workflow.task]]
name = "bad"
run = 'printf "{}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "good"
run = 'printf "{}" > "$CRUCIBLE_OUTPUT"'
"""
    )
    state = tmp_path / "s"
    assert run(plan, state).exit_code == 1  # type: ignore[attr-defined]
    bad, good = result(state, "bad"), result(state, "good")
    assert bad is not None and bad["status"] == "failed" and "refused for the test" in bad["note"]
    assert good is not None and good["status"] == "passed"
