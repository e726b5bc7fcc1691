"""Library tests of the dispatcher's parts that need no plan: process groups,
the session log, the graph, the environment policy, params, verdicts, progress."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

import pytest

from crucible.core import canon
from crucible.core.errors import InputRefused, UsageError
from crucible.core.plan import Plan
from crucible.run.engine import _verdict as verdict
from crucible.run.engine._graph import TaskGraph, build_graph
from crucible.run.engine._progress import describe
from crucible.run.engine._units import Counts
from crucible.run.executors import _environ as environ
from crucible.run.executors import _procs as procs
from crucible.run.session import _params as params
from crucible.run.session import events
from crucible.run.session._log import SessionLog, read_events
from tests.run.dispatchtests import wait_for, wait_gone


def _sh(tmp_path: Path, script: str) -> procs.TaskProcess:
    """``sh -c SCRIPT`` as a task leader in ``tmp_path``, its output to ``tmp_path/log``."""
    log = os.open(tmp_path / "log", os.O_WRONLY | os.O_CREAT)
    try:
        return procs.spawn(
            ["sh", "-c", script],
            env={"PATH": os.environ["PATH"]},
            cwd=tmp_path,
            log_fd=log,
            started=time.monotonic(),
            deadline=None,
        )
    finally:
        os.close(log)


def test_group_kill_reaches_grandchildren(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild.pid"
    proc = _sh(tmp_path, f"sleep 60 & echo $! > {pidfile}; wait")
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "", timeout=2)
    grandchild = int(pidfile.read_text())
    assert os.getpgid(grandchild) == proc.pid  # same group as the leader
    assert procs.kill_group(proc.pid, signal.SIGTERM)
    code = proc.reap()
    assert code == -signal.SIGTERM
    assert not wait_gone([grandchild], seconds=2)


def test_reap_kills_leftovers_of_a_finished_leader(tmp_path: Path) -> None:
    pidfile = tmp_path / "bg.pid"
    proc = _sh(tmp_path, f"sleep 60 >/dev/null 2>&1 & echo $! > {pidfile}")
    import select

    select.select([proc.pidfd], [], [], 10)
    assert proc.reap() == 0
    background = int(pidfile.read_text())
    assert not wait_gone([background], seconds=2)


def test_spawn_does_what_popen_did_and_reports_failures(tmp_path: Path) -> None:
    """posix_spawn replaced Popen: cwd, stdin from /dev/null, output to the log,
    SIGPIPE back to default, a new session, no inherited descriptor."""
    import select

    work = tmp_path / "work"
    work.mkdir()
    leaked_r, leaked_w = os.pipe()
    os.set_inheritable(leaked_w, True)  # what a parent (e.g. make) may hand us
    procs.close_inherited()
    assert not os.get_inheritable(leaked_w)
    log = os.open(tmp_path / "t.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    script = (
        "pwd; cat; echo out; echo err >&2; "
        "grep -E '^(SigIgn|NSpgid|NSsid)' /proc/self/status | tr -s '\\t' ' '; "
        f"ls /proc/self/fd/ | grep -qx {leaked_w} && echo leaked || echo closed; echo $$"
    )
    try:
        proc = procs.spawn(
            ["sh", "-c", script],
            env={"PATH": os.environ.get("PATH", os.defpath)},
            cwd=work,
            log_fd=log,
            started=time.monotonic(),
            deadline=None,
        )
        assert select.select([proc.pidfd], [], [], 10)[0]
        assert proc.reap() == 0
        assert Path.cwd() != work  # the dispatcher's own cwd is back
        lines = (tmp_path / "t.log").read_text().splitlines()
        assert lines[0] == str(work) and lines[1:3] == ["out", "err"]
        fields = dict(line.split(" ", 1) for line in lines[3:6])
        ignored = int(fields["SigIgn:"], 16)
        assert not ignored & (1 << (signal.SIGPIPE - 1))  # Python ignores it; tasks must not
        assert fields["NSpgid:"] == fields["NSsid:"] == lines[7]  # its own session and group
        assert lines[6] == "closed"
        with pytest.raises(FileNotFoundError):
            procs.spawn(
                [str(tmp_path / "no-such-program")],
                env={},
                cwd=work,
                log_fd=log,
                started=0.0,
                deadline=None,
            )
        with pytest.raises(FileNotFoundError):
            procs.spawn(
                ["no-such-program-on-path"],
                env={"PATH": str(tmp_path)},
                cwd=work,
                log_fd=log,
                started=0.0,
                deadline=None,
            )
        with pytest.raises(FileNotFoundError):  # a missing workspace
            procs.spawn(
                ["true"],
                env={"PATH": os.environ.get("PATH", os.defpath)},
                cwd=tmp_path / "gone",
                log_fd=log,
                started=0.0,
                deadline=None,
            )
        with pytest.raises(ValueError):  # NUL in the environment: the caller's bug
            procs.spawn(
                ["true"],
                env={"PATH": os.environ.get("PATH", os.defpath), "X": "a\x00b"},
                cwd=work,
                log_fd=log,
                started=0.0,
                deadline=None,
            )
        assert Path.cwd() != work and Path.cwd() != tmp_path / "gone"
    finally:
        os.close(log)
        os.close(leaked_r)
        os.close(leaked_w)


def test_session_log_lines_are_canonical_and_mirrored(tmp_path: Path) -> None:
    import io

    mirror = io.BytesIO()
    log = SessionLog(tmp_path / "s.jsonl", 2, mirror)
    log.emit(events.task_started(task="a", key=None, attempt=1, pid=1, workspace="work/a"))
    assert (tmp_path / "s.jsonl").read_bytes() == b""  # not before commit
    log.commit()
    log.emit(events.shutdown(reason="completed", exit_code=0))
    log.close()
    data = (tmp_path / "s.jsonl").read_bytes()
    assert data == mirror.getvalue()
    lines = data.splitlines()
    assert len(lines) == 2
    first = canon.loads(lines[0])
    assert canon.dumps(first) == lines[0]
    assert first["event"] == "task_started" and first["session"] == 2 and "key" not in first
    assert [e["event"] for e in read_events(tmp_path / "s.jsonl")] == ["task_started", "shutdown"]


def test_read_events_ignores_a_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"event":"plan_admitted"}\n{"event":"task_sta')
    assert read_events(path) == [{"event": "plan_admitted"}]
    path.write_bytes(b'{"event":"plan_admitted"}\nnot json\n')
    with pytest.raises(Exception, match=r"s.jsonl:2"):
        read_events(path)


def _task(name: str, **kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": name,
        "kind": "command",
        "run": "true",
        "needs": [],
        "join": "all",
    }
    base.update(kw)
    return base


def _graph(plan: Mapping[str, object]) -> TaskGraph:
    return build_graph(Plan.from_json({"version": 1, **plan}))


def test_graph_epilogue_waits_for_everything_and_cycles_are_refused() -> None:
    plan = {"tasks": [_task("a"), _task("b", needs=["a"]), _task("end", epilogue=True), _task("c")]}
    graph = _graph(plan)
    assert set(graph.waits_for["end"]) == {"a", "b", "c"}
    assert graph.order.index("end") == 3
    assert graph.order[:3] == ("a", "b", "c") or graph.order[:3] == ("a", "c", "b")
    cyclic = {"tasks": [_task("a", needs=["b"]), _task("b", needs=["a"])]}
    with pytest.raises(InputRefused, match="cycle"):
        _graph(cyclic)
    with pytest.raises(InputRefused, match="unknown task"):
        _graph({"tasks": [_task("a", needs=["zz"])]})


def test_graph_order_is_declaration_order_among_ready_tasks_and_cycles_are_named() -> None:
    plan = {
        "tasks": [
            _task("z"),
            _task("b", needs=["z"]),
            _task("a"),
            _task("c", needs=["a", "b"]),
            _task("d"),
        ]
    }
    assert _graph(plan).order == ("z", "b", "a", "c", "d")
    three = {"tasks": [_task("a", needs=["c"]), _task("b", needs=["a"]), _task("c", needs=["b"])]}
    with pytest.raises(InputRefused, match=r"cycle: a -> b -> c -> a$|cycle: b -> c -> a -> b$"):
        _graph(three)
    with pytest.raises(InputRefused, match=r"cycle: s -> s$"):
        _graph({"tasks": [_task("ok"), _task("s", needs=["s"])]})


def test_environment_policy_by_edition() -> None:
    host = {
        "PATH": "/bin",
        "HOME": "/root",
        "SECRET": "s",
        "TOKEN": "t",
        "CRUCIBLE_INPUTS": "leak",
        "LANG": "C",
    }
    task = {"name": "a", "env": ["TOKEN", "CRUCIBLE_INPUTS", "ABSENT"]}
    ed1 = environ.task_environment(1, task["env"], host)
    assert ed1 == {"PATH": "/bin", "HOME": "/root", "SECRET": "s", "TOKEN": "t", "LANG": "C"}
    for edition in (2, 3):
        env = environ.task_environment(edition, task["env"], host)
        assert env == {"PATH": "/bin", "LANG": "C", "TOKEN": "t"}


def test_params_resolution() -> None:
    workflow = {
        "name": "w",
        "params": {
            "who": {"type": "string", "default": "world"},
            "n": {"type": "integer"},
            "opts": {"type": "object", "default": {}},
        },
    }
    plan = Plan.from_json({"version": 1, "workflow": workflow, "tasks": []})
    got = params.resolve_params(plan, {"n": 2}, ("who=3", "n=5"))
    assert got == {"who": "3", "n": 5, "opts": {}}
    with pytest.raises(InputRefused, match="required"):
        params.resolve_params(plan, {}, ())
    with pytest.raises(InputRefused, match="unknown param 'nope'"):
        params.resolve_params(plan, {}, ("nope=1", "n=1"))
    with pytest.raises(InputRefused, match="must be an integer, not a string"):
        params.resolve_params(plan, {"n": "x"}, ())
    with pytest.raises(InputRefused, match="not JSON"):
        params.resolve_params(plan, {}, ("n=abc",))
    with pytest.raises(InputRefused, match="must be an integer, not a boolean"):
        params.resolve_params(plan, {}, ("n=true",))
    with pytest.raises(UsageError):
        params.resolve_params(plan, {}, ("novalue",))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"verdict":"pass"}', None),
        (b'{"verdict":"fail","reason":"too slow"}', "verdict: fail: too slow"),
        (b'{"verdict":true}', 'verdict must be "pass" or "fail"'),
        (b"{}", 'no "verdict"'),
        (b"[1]", 'no "verdict"'),
        (b"not json", "no readable result"),
    ],
)
def test_verdict_rules(tmp_path: Path, body: bytes, expected: str | None) -> None:
    out = tmp_path / "o.json"
    out.write_bytes(body)
    _, problem = verdict.check(out)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and expected in problem


def test_progress_line() -> None:
    counts = Counts(total=10, passed=4, failed=1, skipped=0, running=2, started_at=100.0)
    line = describe(counts, now=110.0)
    assert "done 4" in line and "running 2" in line and "failed 1" in line and "remaining 5" in line
    assert "elapsed 0:00:10" in line and "ETA 0:00:10" in line
