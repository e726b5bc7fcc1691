"""Issue 32 items 4-7 through real ``crucible-dispatch`` subprocesses: the
include-only matrix, ``on_empty``, sequences with ``format`` and params, and
``retry.when``; plus the start-up double run of a settled join."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from tests.run.dispatchtests import DISPATCH


def dispatch(
    tmp_path: Path, toml: str, *args: str, state: str = "state"
) -> subprocess.CompletedProcess[str]:
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent(toml).lstrip())
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / state), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "session.jsonl").read_text().splitlines()]


def finished(state: Path) -> dict[str, dict[str, Any]]:
    """task (``task[key]`` for an instance) -> its last ``task_finished``."""
    out = {}
    for e in events(state):
        if e["event"] == "task_finished":
            label = e["task"] if e.get("key") is None else f"{e['task']}[{e['key']}]"
            out[label] = e
    return out


def record(state: Path, task: str) -> dict[str, Any]:
    return json.loads((state / "results" / f"{task}.json").read_bytes())  # type: ignore[no-any-return]


# -- the start-up double run -------------------------------------------------------


def test_a_settled_join_after_a_start_up_skip_runs_once(tmp_path: Path) -> None:
    """A task skipped while the dispatcher starts wakes its consumers at once; the
    start-up walk then reached the same consumer: a settled join ran twice."""
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "dbl"
        [[workflow.task]]
        name = "a"
        when = "False"
        run = "true"
        [[workflow.task]]
        name = "b"
        needs = ["a"]
        join = "settled"
        run = "echo ran >> \\"$CRUCIBLE_PACK_DIR/b.count\\""
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "b.count").read_text() == "ran\n"
    started = [e["task"] for e in events(tmp_path / "state") if e["event"] == "task_started"]
    assert started == ["b"]
    assert "1 passed, 0 failed, 1 skipped" in proc.stderr


# -- item 4: the include-only matrix -------------------------------------------------

#: each instance writes its key and item into its output
ECHO = (
    'run = \'printf "{\\"item\\": %s, \\"key\\": \\"%s\\"}" '
    '"$(cat "$CRUCIBLE_INPUTS_DIR/item")" "$CRUCIBLE_KEY" > "$CRUCIBLE_OUTPUT"\'\n'
)


def instance_outputs(state: Path, task: str) -> dict[str, Any]:
    """key -> output of each instance, in the aggregate record's order."""
    from crucible import stage

    out = {}
    for key in record(state, task)["keys"]:
        rec = stage.load_result(state, task, key)
        assert rec is not None
        out[key] = rec.get("output")
    return out


def test_an_include_only_matrix_runs_exactly_its_entries_in_order(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "inc"
        [[workflow.task]]
        name = "t"
        matrix = {{ include = [
          {{ os = "ubuntu-latest", python = "3.12" }},
          {{ os = "macos-latest", python = "3.11", experimental = true }},
        ] }}
        emits = {{ item = "object", key = "string" }}
        {ECHO}""",
    )
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    keys = ["os=ubuntu-latest,python=3.12", "experimental=true,os=macos-latest,python=3.11"]
    (admitted,) = [e for e in events(state) if e["event"] == "plan_admitted"]
    assert admitted["tasks"][0]["instances"] == keys
    assert admitted["tasks"][0]["matrix"] == []
    assert instance_outputs(state, "t") == {
        keys[0]: {"item": {"os": "ubuntu-latest", "python": "3.12"}, "key": keys[0]},
        keys[1]: {
            "item": {"experimental": True, "os": "macos-latest", "python": "3.11"},
            "key": keys[1],
        },
    }
    assert record(state, "t")["status"] == "passed"


def test_an_empty_axis_leaves_only_the_include_entries(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "inc"
        [[workflow.task]]
        name = "t"
        matrix = {{ os = [], include = [{{ os = "solaris" }}] }}
        emits = {{ item = "object", key = "string" }}
        {ECHO}""",
    )
    assert proc.returncode == 0, proc.stderr
    assert instance_outputs(tmp_path / "state", "t") == {
        "os=solaris": {"item": {"os": "solaris"}, "key": "os=solaris"}
    }


# -- item 5: on_empty -------------------------------------------------------------------

ON_EMPTY = """
edition = 4
[workflow]
name = "emp"
[workflow.params.regions]
type = "array"
default = []
[[workflow.task]]
name = "deploy"
map = "params.regions"
{on_empty}
run = "true"
[[workflow.task]]
name = "announce"
needs = ["deploy"]
run = "echo announce >> \\"$CRUCIBLE_PACK_DIR/ran\\""
[[workflow.task]]
name = "cleanup"
needs = ["deploy"]
join = "settled"
run = "echo cleanup >> \\"$CRUCIBLE_PACK_DIR/ran\\""
"""


def test_on_empty_skip_settles_an_empty_fanout_skipped_and_skips_its_all_joins(
    tmp_path: Path,
) -> None:
    proc = dispatch(tmp_path, ON_EMPTY.format(on_empty='on_empty = "skip"'))
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    deploy = record(state, "deploy")
    assert (deploy["status"], deploy["keys"]) == ("skipped", [])
    assert deploy["note"] == 'skipped: the fan-out has no instances (on_empty = "skip")'
    done = finished(state)
    assert done["deploy"]["status"] == "skipped" and done["deploy"]["instances"] == 0
    assert done["announce"]["status"] == "skipped"
    assert done["announce"]["note"] == "skipped: needs 'deploy', which was skipped"
    assert done["cleanup"]["status"] == "passed"
    assert (tmp_path / "ran").read_text() == "cleanup\n"  # once: no start-up double run
    assert "1 passed, 0 failed, 2 skipped" in proc.stderr


def test_on_empty_pass_is_the_default_and_a_nonempty_fanout_runs(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, ON_EMPTY.format(on_empty=""))
    assert proc.returncode == 0, proc.stderr
    assert record(tmp_path / "state", "deploy")["status"] == "passed"
    assert sorted((tmp_path / "ran").read_text().split()) == ["announce", "cleanup"]
    proc = dispatch(
        tmp_path, ON_EMPTY.format(on_empty='on_empty = "skip"'), "-p", 'regions=["eu"]', state="s2"
    )
    assert proc.returncode == 0, proc.stderr
    assert record(tmp_path / "s2", "deploy")["keys"] == ["0"]
    assert record(tmp_path / "s2", "deploy")["status"] == "passed"


# -- item 6: sequences ------------------------------------------------------------------

SEQUENCES = """
edition = 4
[workflow]
name = "seq"
[workflow.params.shards]
type = "integer"
default = 3
[workflow.params.from]
type = "integer"
default = 5
[[workflow.task]]
name = "months"
map = {{ start = 1, end = 12, step = 5, format = "%02d" }}
emits = {{ item = "any", key = "string" }}
{echo}
[[workflow.task]]
name = "shard"
map = {{ count = "params.shards", format = "part-%03d.csv" }}
on_empty = "skip"
emits = {{ item = "any", key = "string" }}
{echo}
[[workflow.task]]
name = "countdown"
map = {{ start = "params.from", end = 1, step = -1 }}
on_empty = "skip"
emits = {{ item = "any", key = "string" }}
{echo}
"""


def items(state: Path, task: str) -> list[Any]:
    return [out["item"] for out in instance_outputs(state, task).values()]


def test_sequences_format_read_params_and_count_down(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, SEQUENCES.format(echo=ECHO))
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    assert items(state, "months") == ["01", "06", "11"]
    assert items(state, "shard") == ["part-000.csv", "part-001.csv", "part-002.csv"]
    assert items(state, "countdown") == [5, 4, 3, 2, 1]
    assert list(instance_outputs(state, "countdown")) == ["0", "1", "2", "3", "4"]
    proc = dispatch(
        tmp_path, SEQUENCES.format(echo=ECHO), "-p", "shards=1", "-p", "from=2", state="s2"
    )
    assert proc.returncode == 0, proc.stderr
    assert items(tmp_path / "s2", "shard") == ["part-000.csv"]
    assert items(tmp_path / "s2", "countdown") == [2, 1]


def test_a_param_sequence_counting_nothing_is_an_empty_fanout(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, SEQUENCES.format(echo=ECHO), "-p", "shards=0", "-p", "from=0")
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    for name in ("shard", "countdown"):  # on_empty = "skip"
        assert (record(state, name)["status"], record(state, name)["keys"]) == ("skipped", [])


def test_a_negative_count_param_is_refused_at_admission(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, SEQUENCES.format(echo=ECHO), "-p", "shards=-1")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "params.shards" in proc.stderr and "must not be negative" in proc.stderr
    assert not (tmp_path / "state" / "plan.json").exists()  # refused before the claim


def test_a_param_sequence_over_the_bound_fails_its_task_with_a_note(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, SEQUENCES.format(echo=ECHO), "-p", "shards=100001")
    assert proc.returncode == 1
    state = tmp_path / "state"
    shard = record(state, "shard")
    assert shard["status"] == "failed"
    assert "100,001 numbers, more than 100,000" in shard["note"]
    assert not (state / "work" / "shard").exists()  # nothing started
    assert record(state, "months")["status"] == "passed"


# -- item 7: retry.when -------------------------------------------------------------------


def attempts(state: Path, task: str) -> list[dict[str, Any]]:
    return [
        e
        for e in events(state)
        if e["event"] == "task_finished" and e["task"] == task and "attempt" in e
    ]


#: fails with 75 twice (transient), then 3 (not worth a retry)
FLAKY = (
    'n=$(cat "$CRUCIBLE_PACK_DIR/n" 2>/dev/null || echo 0); n=$((n+1)); '
    'echo $n > "$CRUCIBLE_PACK_DIR/n"; '
    "if [ $n -lt 3 ]; then echo transient >&2; exit 75; fi; echo broken >&2; exit 3"
)


def test_retry_when_retries_while_its_condition_holds(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "rw"
        [[workflow.task]]
        name = "flaky"
        retry = {{ limit = 5, delay = 0, when = "last.exit_code in (69, 75) or last.reason == 'timeout'" }}
        run = '{FLAKY}'
        """,
    )
    assert proc.returncode == 1
    state = tmp_path / "state"
    tries = attempts(state, "flaky")
    assert [(e["attempt"], e["exit_code"], e.get("retry")) for e in tries] == [
        (1, 75, True),
        (2, 75, True),
        (3, 3, None),
    ]
    note = record(state, "flaky")["note"]
    assert note.split("\n")[0].endswith(
        "; no retry: retry.when is false: last.exit_code in (69, 75) or last.reason == 'timeout'"
    )
    assert note.split("\n")[1] == "broken"


def test_retry_when_and_the_shorthands_combine_as_and(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "rw"
        [[workflow.task]]
        name = "once"
        retry = { limit = 5, delay = 0, on_exit = [75], when = "last.attempt < 2" }
        run = "exit 75"
        [[workflow.task]]
        name = "other-code"
        retry = { limit = 5, delay = 0, on_exit = [75], when = "True" }
        run = "exit 4"
        """,
    )
    assert proc.returncode == 1
    state = tmp_path / "state"
    assert len(attempts(state, "once")) == 2
    assert "no retry: retry.when is false: last.attempt < 2" in record(state, "once")["note"]
    assert len(attempts(state, "other-code")) == 1  # on_exit said no: when is not asked
    assert "no retry: exit code 4 is not in on_exit" in record(state, "other-code")["note"]


def test_retry_when_reads_the_tail_the_signal_and_the_duration(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "rw"
        [[workflow.task]]
        name = "tail"
        retry = { limit = 3, delay = 0, when = "'try again' in last.stderr_tail and last.attempt < 3 and last.duration_s >= 0 and last.reason == 'exit' and last.signal == None" }
        run = 'echo "please try again" >&2; exit 1'
        [[workflow.task]]
        name = "slow"
        timeout = 0.3
        retry = { limit = 3, delay = 0, when = "last.reason == 'timeout' and last.signal == 'SIGTERM' and last.exit_code == None and last.attempt < 2" }
        run = "sleep 30"
        [[workflow.task]]
        name = "refused"
        emits = { v = "integer" }
        retry = { limit = 3, delay = 0, when = "last.reason == 'result' and last.exit_code == 0 and last.attempt < 2" }
        run = "true"
        """,
    )
    assert proc.returncode == 1
    state = tmp_path / "state"
    assert len(attempts(state, "tail")) == 3
    assert len(attempts(state, "slow")) == 2
    assert "after timeout 0.3s" in record(state, "slow")["note"]
    assert len(attempts(state, "refused")) == 2


def test_a_retry_when_error_ends_the_retries_with_the_error(tmp_path: Path) -> None:
    loop = "len([1 for a in range(100000) for b in range(100000) if False]) == 0"
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "rw"
        [[workflow.task]]
        name = "typed"
        retry = {{ limit = 3, delay = 0, when = "last.exit_code" }}
        run = "exit 1"
        [[workflow.task]]
        name = "spin"
        retry = {{ limit = 3, delay = 0, when = "{loop}" }}
        run = "exit 1"
        [[workflow.task]]
        name = "after"
        needs = ["typed"]
        join = "settled"
        run = "true"
        """,
    )
    assert proc.returncode == 1
    state = tmp_path / "state"
    assert len(attempts(state, "typed")) == 1
    assert record(state, "typed")["note"] == (
        "exited with status 1; no retry: retry.when error: last.exit_code: "
        "a condition must be true or false, not int"
    )
    assert len(attempts(state, "spin")) == 1  # bounded like when: the run goes on
    assert (
        f"no retry: retry.when error: {loop}: evaluation took longer than"
        in (record(state, "spin")["note"])
    )
    assert record(state, "after")["status"] == "passed"


def test_a_lost_workers_attempt_is_put_to_retry_when_as_lost() -> None:
    from crucible.run.engine._control import Retry
    from crucible.run.engine._retry_when import apply_retry_when, last_attempt

    last = last_attempt(
        attempt=1, exit_code=None, timed_out=False, duration=None, tail="", lost=True
    )
    assert last == {
        "exit_code": None,
        "signal": None,
        "reason": "lost",
        "duration_s": None,
        "stderr_tail": "",
        "attempt": 1,
    }
    from crucible.core.plan import Task

    def task_with(when: str) -> Task:
        retry = {"limit": 2, "when": when}
        return Task.from_json({"name": "t", "kind": "command", "retry": retry}, "$", 3)

    task = task_with("last.reason == 'lost'")
    assert apply_retry_when(task, Retry(0.5), last) == Retry(0.5)
    task = task_with("last.reason != 'lost'")
    assert apply_retry_when(task, Retry(0.5), last).delay is None
    assert apply_retry_when(task, Retry(None, "no"), last) == Retry(None, "no")  # not asked
    killed = last_attempt(attempt=2, exit_code=-9, timed_out=False, duration=1.5, tail="x")
    assert (killed["signal"], killed["reason"], killed["exit_code"]) == ("SIGKILL", "signal", None)


def test_a_dry_run_says_an_empty_fanout_will_settle_skipped(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, ON_EMPTY.format(on_empty='on_empty = "skip"'), "-n")
    assert proc.returncode == 0, proc.stderr
    (line,) = [row for row in proc.stdout.splitlines() if " deploy " in row]
    assert line.endswith('no instances: settles skipped (on_empty = "skip")'), line


def test_a_wider_param_sequence_reuses_the_instances_already_cached(tmp_path: Path) -> None:
    """The params a sequence's bounds read reach each instance as its item, not
    as params: widening the count reruns only the new numbers (cache.md, Params)."""
    toml = f"""
    edition = 4
    [workflow]
    name = "wide"
    [workflow.params.n]
    type = "integer"
    default = 2
    [[workflow.task]]
    name = "t"
    map = {{ count = "params.n", format = "n%d" }}
    emits = {{ item = "any", key = "string" }}
    {ECHO}"""
    cache = str(tmp_path / "cache")
    proc = dispatch(tmp_path, toml, "--cache", cache)
    assert proc.returncode == 0, proc.stderr
    proc = dispatch(tmp_path, toml, "--cache", cache, "-p", "n=3", state="s2")
    assert proc.returncode == 0, proc.stderr
    cached = {k: e.get("cached") for k, e in finished(tmp_path / "s2").items() if "[" in k}
    assert cached == {"t[0]": True, "t[1]": True, "t[2]": None}
    assert items(tmp_path / "s2", "t") == ["n0", "n1", "n2"]


def test_on_empty_skip_over_a_producer_field_and_an_empty_matrix(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "emp"
        [[workflow.task]]
        name = "list"
        emits = { names = "array" }
        run = 'echo "{\\"names\\": []}" > "$CRUCIBLE_OUTPUT"'
        [[workflow.task]]
        name = "each"
        needs = ["list"]
        map = "list.names"
        on_empty = "skip"
        run = "true"
        [[workflow.task]]
        name = "grid"
        matrix = { os = [], py = ["3.12"] }
        on_empty = "skip"
        run = "true"
        [[workflow.task]]
        name = "after"
        needs = ["each", "grid"]
        run = "true"
        """,
    )
    assert proc.returncode == 0, proc.stderr
    done = finished(tmp_path / "state")
    assert [done[n]["status"] for n in ("list", "each", "grid", "after")] == [
        "passed",
        "skipped",
        "skipped",
        "skipped",
    ]
    assert done["each"]["note"] == 'skipped: the fan-out has no instances (on_empty = "skip")'


def _evaluator_running(dispatcher: int) -> bool:
    """The bounded evaluator's child (``python -c … <dispatcher pid>``) is alive."""
    import os

    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"-c" in argv and argv[-2:] == [str(dispatcher).encode(), b""]:
            return True
    return False


def test_sigterm_stops_a_run_while_a_retry_condition_is_evaluated(tmp_path: Path) -> None:
    import signal

    from tests.run.dispatchtests import reaped, start_dispatch, wait_for, write_pack

    loop = "len([1 for a in range(100000) for b in range(100000) if False]) == 0"
    pack = write_pack(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "rw"
        [[workflow.task]]
        name = "spin"
        retry = {{ limit = 3, delay = 0, when = "{loop}" }}
        run = "exit 1"
        """,
    )
    state = tmp_path / "state"
    with reaped(start_dispatch(pack, state)) as proc:
        wait_for(lambda: _evaluator_running(proc.pid))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    # undecided, not failed: the attempt's record is gone and a resume runs it again
    assert not (state / "results" / "spin.json").exists()
    retried = [e for e in attempts(state, "spin") if e.get("retry")]
    assert len(retried) == 1 and retried[0]["attempt"] == 1
