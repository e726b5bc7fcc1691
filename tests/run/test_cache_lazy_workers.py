"""Lazy workers (crucible.run.executors._workers, docs/spec/run.md "Workers"): a local pool
forks at the first unit that needs a worker, so a fully cached rerun forks no
process at all, and a run that misses after hits still runs its misses under
``-j``. Forks are counted in-process (``os.fork`` wrapped) and, through real
subprocesses, by ``worker_max_rss_kib`` (0 when no worker ran)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from crucible.core.errors import Interrupted
from crucible.run.session._admit import worker_count
from tests.run.dispatchtests import DISPATCH, events, one_line, wait_for

HITS = 4
MISSES = 4


def _pack_text(sleep: float = 0.0, m0_run: str | None = None) -> str:
    """HITS tasks that always hit, and MISSES tasks whose key follows $X (each
    task process of those marks its start and end in $LOG)."""
    body = ['edition = 3\n\n[workflow]\nname = "lazy"\n']
    for i in range(HITS):
        body.append(f'[[workflow.task]]\nname = "h{i}"\nrun = "true"\n')
    for i in range(MISSES):
        run = (
            f'echo "+ $(date +%s%N)" >> "$LOG"; sleep {sleep}; echo "- $(date +%s%N)" >> "$LOG"'
            if i or m0_run is None
            else m0_run
        )
        body.append(
            f'[[workflow.task]]\nname = "m{i}"\nneeds = ["h0"]\nenv = ["X", "LOG"]\n'
            f"run = '{run}'\n"
        )
    return "\n".join(body)


def _compile(tmp: Path, text: str) -> Path:
    from crucible.compile import compile_path

    (tmp / "pack.toml").write_text(text)
    plan = tmp / "plan.json"
    plan.write_bytes(compile_path(tmp / "pack.toml").data)
    return plan


@pytest.fixture
def forks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Every os.fork of this process during the test (the children's pids)."""
    seen: list[int] = []
    real = os.fork

    def counting() -> int:
        pid = real()
        if pid:
            seen.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", counting)
    yield seen


def _in_process(plan: Path, state: Path, cache: Path, x: str = "1", **kw: Any) -> Any:
    """run_plan in this process (its forks are counted), with X delivered."""
    from crucible.run import RunOptions
    from crucible.run.session._runner import run_plan

    options = RunOptions(plan=plan, state=state, cache=cache, backoff=0.01, kill_grace=1.0, **kw)
    return run_plan(options, environ=_environ(x, state))


def _environ(x: str, state: Path) -> dict[str, str]:
    return {
        "PATH": os.environ["PATH"],
        "HOME": "/nonexistent",
        # a CLI with no locale set coerces LC_CTYPE (PEP 538), and a task
        # receives it: the same value here keeps the keys of both equal
        "LC_CTYPE": "C.UTF-8",
        "X": x,
        "LOG": str(state.parent / "log"),
    }


def _run_finished(state: Path) -> dict[str, Any]:
    return next(e for e in events(state) if e["event"] == "run_finished")


def test_a_fully_cached_rerun_forks_no_worker(tmp_path: Path, forks: list[int]) -> None:
    plan = _compile(tmp_path, _pack_text())
    cache = tmp_path / "cache"
    first = _in_process(plan, tmp_path / "s1", cache, jobs=2)
    assert first.status == "passed"
    assert len(forks) == worker_count(2)  # the whole pool, forked at the first unit
    assert _run_finished(tmp_path / "s1")["worker_max_rss_kib"] > 0
    forks.clear()
    second = _in_process(plan, tmp_path / "s2", cache, jobs=2)
    assert second.status == "passed"
    assert second.counts["passed"] == HITS + MISSES
    assert forks == []
    finished = _run_finished(tmp_path / "s2")
    assert finished["worker_max_rss_kib"] == 0  # no worker ran (docs/spec/run.md)
    assert not any(e["event"] == "task_started" for e in events(tmp_path / "s2"))


def test_the_cli_rerun_reports_no_worker(tmp_path: Path) -> None:
    plan = _compile(tmp_path, _pack_text())
    env = {**os.environ, "X": "1", "LOG": str(tmp_path / "log")}
    for n in (1, 2):
        argv = [DISPATCH, str(plan), "--state", str(tmp_path / f"s{n}")]
        argv += ["--cache", str(tmp_path / "cache")]
        subprocess.run(argv, check=True, capture_output=True, env=env, timeout=120)
    assert _run_finished(tmp_path / "s1")["worker_max_rss_kib"] > 0
    assert _run_finished(tmp_path / "s2")["worker_max_rss_kib"] == 0


def _max_running(log: Path) -> int:
    """The most task processes alive at once, from the lines they wrote."""
    marks = sorted(
        (int(t), sign) for sign, t in (line.split() for line in log.read_text().splitlines())
    )
    running = peak = 0
    for _, sign in marks:
        running += 1 if sign == "+" else -1
        peak = max(peak, running)
    return peak


def test_misses_after_hits_run_under_jobs(tmp_path: Path, forks: list[int]) -> None:
    plan = _compile(tmp_path, _pack_text(sleep=0.3))
    cache = tmp_path / "cache"
    assert _in_process(plan, tmp_path / "s1", cache, jobs=2).status == "passed"
    forks.clear()
    (tmp_path / "log").write_text("")
    outcome = _in_process(plan, tmp_path / "s2", cache, x="2", jobs=2)
    assert outcome.status == "passed"
    assert len(forks) == worker_count(2)  # the misses needed the pool
    finished = [e for e in events(tmp_path / "s2") if e["event"] == "task_finished"]
    cached = {e["task"] for e in finished if e.get("cached")}
    ran = {e["task"] for e in finished if not e.get("cached")}
    assert cached == {f"h{i}" for i in range(HITS)}
    assert ran == {f"m{i}" for i in range(MISSES)}
    assert _max_running(tmp_path / "log") == 2  # -j 2, with 4 sleeping misses ready at once
    assert _run_finished(tmp_path / "s2")["worker_max_rss_kib"] > 0


def _resume_cli(plan: Path, state: Path, cache: Path) -> subprocess.CompletedProcess[str]:
    argv = [DISPATCH, str(plan), "--state", str(state), "--cache", str(cache), "--resume"]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        env=_environ("2", state),  # the in-process runs' (the key covers what is passed)
    )


def _settled_all(state: Path) -> bool:
    from crucible import stage

    names = [f"h{i}" for i in range(HITS)] + [f"m{i}" for i in range(MISSES)]
    return all(
        (r := stage.load_result(state, n)) is not None and r["status"] == "passed" for n in names
    )


def test_sigterm_during_the_first_lazy_fork(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _compile(tmp_path, _pack_text())
    cache = tmp_path / "cache"
    assert _in_process(plan, tmp_path / "s1", cache, jobs=2).status == "passed"
    real = os.fork
    calls: list[int] = []

    def signalled_fork() -> int:
        if not calls:  # the dispatcher's handler sees it while the pool forks
            os.kill(os.getpid(), signal.SIGTERM)
        calls.append(1)
        return real()

    monkeypatch.setattr(os, "fork", signalled_fork)
    with pytest.raises(Interrupted) as caught:
        _in_process(plan, tmp_path / "s2", cache, x="2", jobs=2)
    monkeypatch.setattr(os, "fork", real)
    assert caught.value.exit_code == 143
    assert calls  # the misses did start the pool
    shutdown = [e for e in events(tmp_path / "s2") if e["event"] == "shutdown"]
    assert shutdown[-1]["signal"] == "SIGTERM"
    resumed = _resume_cli(plan, tmp_path / "s2", cache)
    assert resumed.returncode == 0, resumed.stderr
    assert _settled_all(tmp_path / "s2")


def test_sigint_during_a_fully_cached_run_stops_the_hits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, forks: list[int]
) -> None:
    from crucible.run.cache._unit import UnitCache

    plan = _compile(tmp_path, _pack_text())
    cache = tmp_path / "cache"
    assert _in_process(plan, tmp_path / "s1", cache, x="2", jobs=2).status == "passed"
    forks.clear()
    real: Callable[..., Any] = UnitCache._restore
    writes: list[Any] = []

    def signalled(self: UnitCache, ck: Any, hit: Any, attempt: int) -> Any:
        # a hit's record is restored here (linked from the store, or written)
        restored = real(self, ck, hit, attempt)
        writes.append(restored)
        if len(writes) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return restored

    monkeypatch.setattr(UnitCache, "_restore", signalled)
    with pytest.raises(Interrupted) as caught:
        _in_process(plan, tmp_path / "s2", cache, x="2", jobs=2)
    assert caught.value.exit_code == 130
    assert len(writes) == 2  # the pass ended at the signal
    assert forks == []  # and no worker was forked for the units left
    monkeypatch.setattr(UnitCache, "_restore", real)
    resumed = _resume_cli(plan, tmp_path / "s2", cache)
    assert resumed.returncode == 0, resumed.stderr
    assert _settled_all(tmp_path / "s2")
    assert not any(e["event"] == "task_started" for e in events(tmp_path / "s2"))


def _log_bytes(state: Path) -> bytes:
    try:
        return (state / "session.jsonl").read_bytes()
    except FileNotFoundError:
        return b""


def test_cli_sigint_with_a_miss_after_hits_is_one_line_and_resumes(tmp_path: Path) -> None:
    marker = tmp_path / "slept"
    slow = f"[ -e {marker} ] || {{ touch {marker}; exec sleep 30; }}"
    plan = _compile(tmp_path, _pack_text(m0_run=f"touch {marker}"))
    cache = tmp_path / "cache"
    env = {**os.environ, "X": "1", "LOG": str(tmp_path / "log")}
    base = [DISPATCH, str(plan), "--cache", str(cache)]
    subprocess.run([*base, "--state", str(tmp_path / "s1")], check=True, env=env, timeout=120)
    marker.unlink()
    plan = _compile(tmp_path, _pack_text(m0_run=slow))  # m0 misses, the rest hit
    state = tmp_path / "s2"
    proc = subprocess.Popen(
        [*base, "--state", str(state)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    try:
        wait_for(lambda: marker.exists() and b'"task_started"' in _log_bytes(state))
        time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "interrupted by SIGINT" in one_line(err)
    cached = [e for e in events(state) if e["event"] == "task_finished" and e.get("cached")]
    assert len(cached) >= HITS
    resumed = subprocess.run(
        [*base, "--state", str(state), "--resume"], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((state / "results" / "m0.json").read_text())["status"] == "passed"
