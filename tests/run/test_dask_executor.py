"""``--executor dask|dask-local`` (issue 19) through real ``crucible-dispatch``
subprocesses on real Dask clusters: a LocalCluster of 2 worker processes on
loopback started by the dispatcher, or a ``dask scheduler`` and ``dask worker``
processes started here. Every wait is bounded."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from crucible.run.executors._usage import USAGE_FIELDS
from tests.packed import keyed
from tests.run.dasktests import (
    FIRST_OF_0,
    LOCAL,
    cluster,
    dispatch,
    held_pack,
    start_worker,
    wait_workers,
)
from tests.run.dispatchtests import (
    Gate,
    events,
    finished,
    reaped,
    start_dispatch,
    wait_files,
    wait_gone,
    write_pack,
)

pytest.importorskip("distributed")

FANOUT = """
edition = 4
[workflow]
name = "fan"
[[workflow.task]]
name = "t"
map = {{ count = {n} }}
emits = {{ item = "integer", key = "string" }}
emits_files = ["note.txt"]
run = 'echo "n$CRUCIBLE_KEY" > note.txt; printf "{{\\"item\\": %s, \\"key\\": \\"%s\\"}}" "$(cat "$CRUCIBLE_INPUTS_DIR/item")" "$CRUCIBLE_KEY" > "$CRUCIBLE_OUTPUT"'
[[workflow.task]]
name = "join"
needs = ["t"]
inputs = {{ keys = "t.key" }}
emits = {{ n = "integer" }}
run = 'echo "{{\\"n\\": $(ls "$CRUCIBLE_INPUTS_DIR/keys" | wc -l)}}" > "$CRUCIBLE_OUTPUT"'
"""


#: FANOUT with a settled join, and failures: each instance whose key ends in 37
#: writes a line to stderr and exits 3 (their records carry the log's tail)
SETTLED = FANOUT.replace(
    'run = \'echo "n$CRUCIBLE_KEY"',
    'run = \'case $CRUCIBLE_KEY in *37) echo "no $CRUCIBLE_KEY" >&2; exit 3;; esac;'
    ' echo "n$CRUCIBLE_KEY"',
).replace('needs = ["t"]', 'needs = ["t"]\njoin = "settled"')


def _measured_out(record: Any) -> Any:
    """A record without what its attempt cost (run.md, "Resource usage"): CPU
    and memory differ from one run to the next, and between executors."""
    return {k: v for k, v in record.items() if k != "usage"}


def tree(root: Path) -> dict[str, Any]:
    """Every file's bytes; a record without its usage; a packed records file's
    records by key (its lines' order is the order units settled in)."""
    return {
        str(p.relative_to(root)): {k: _measured_out(r) for k, r in keyed(root.parent, p.stem).items()}
        if p.suffix == ".jsonl"
        else _measured_out(json.loads(p.read_bytes()))
        if root.name == "results" and p.suffix == ".json"
        else p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }  # fmt: skip


_VARYING = {"time", "pid", "worker", "duration", "max_rss_kib", "worker_max_rss_kib", "session"}
_VARYING |= set(USAGE_FIELDS)  # what each attempt cost


def event_contents(state: Path) -> list[str]:
    """The session's events without timings, pids and worker names, in a fixed order."""
    out = []
    for e in events(state):
        kept = {k: v for k, v in e.items() if k not in _VARYING}
        out.append(json.dumps(kept, sort_keys=True))
    return sorted(out)


def test_help_does_not_import_dask() -> None:
    code = (
        "import sys\n"
        "from crucible.run.cli import main\n"
        "sys.argv = ['crucible-dispatch', 'run', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "assert 'distributed' not in sys.modules and 'dask' not in sys.modules, 'dask imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--executor" in proc.stdout and "--threads-per-worker" in proc.stdout


@pytest.mark.parametrize("executor", ["dask", "dask-local"])
def test_without_dask_one_line_says_how_to_install(tmp_path: Path, executor: str) -> None:
    pack = write_pack(tmp_path, FANOUT.format(n=2))
    code = (
        "import sys\n"
        "sys.modules['distributed'] = None  # as if not installed: import raises\n"
        "from crucible.run.cli import main\n"
        f"sys.argv = ['crucible-dispatch', {str(pack)!r}, '--state', {str(tmp_path / 's')!r},"
        f" '--executor', {executor!r}, '--scheduler', 'tcp://127.0.0.1:1']\n"
        "main()\n"
    )
    if executor == "dask-local":
        code = code.replace(", '--scheduler', 'tcp://127.0.0.1:1'", "")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "pip install 'crucible[dask]'" in proc.stderr
    assert not (tmp_path / "s").exists()


def test_dask_needs_a_scheduler(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, FANOUT.format(n=2))
    proc = dispatch(pack, tmp_path / "s", "--executor", "dask")
    assert proc.returncode == 2 and "--scheduler" in proc.stderr
    assert not (tmp_path / "s").exists()


def test_fanout_with_a_join_gives_the_same_records_and_files_as_local(tmp_path: Path) -> None:
    """Issue 19's Done means: 1,000 instances (10 of them failing) and a settled join."""
    n = 1000
    pack = write_pack(tmp_path, SETTLED.format(n=n))
    assert pack.read_text().count("*37)") == 1 and 'join = "settled"' in pack.read_text()
    local = dispatch(pack, tmp_path / "local", "-j", "4", timeout=300)
    assert local.returncode == 1, local.stderr
    remote = dispatch(pack, tmp_path / "dask", "-j", "4", *LOCAL, timeout=300)
    assert remote.returncode == 1, remote.stderr
    for sub in ("results", "output", "instances", "files"):
        assert tree(tmp_path / "local" / sub) == tree(tmp_path / "dask" / sub), sub
    failed = keyed(tmp_path / "dask", "t")["137"]
    assert failed["status"] == "failed" and "no 137" in failed["stderr_tail"]
    join = json.loads((tmp_path / "dask" / "results" / "join.json").read_bytes())
    assert join["status"] == "passed"
    assert join["output"] == {"n": n - 10}  # a passed attempt's output file is removed
    n -= 10
    # captured files: every instance's note.txt
    assert len([k for k in tree(tmp_path / "dask" / "files") if k.endswith("note.txt")]) == n
    assert event_contents(tmp_path / "local") == event_contents(tmp_path / "dask")
    workers = {e["worker"] for e in events(tmp_path / "dask") if e["event"] == "task_started"}
    assert len(workers) == 2 and all(w.startswith("tcp://127.0.0.1:") for w in workers)
    assert not any("worker" in e for e in events(tmp_path / "local"))


@pytest.mark.parametrize("count", [4, 24])
def test_sigterm_leaves_no_task_process_and_the_state_resumes(tmp_path: Path, count: int) -> None:
    """24 units go in batches of 3 (crucible.run.executors.dask._batches): the ones
    behind a running unit are handed back, wait for a slot, and are not
    started when the run stops."""
    pids = tmp_path / "pids"
    pids.mkdir()
    gate = tmp_path / "gate"
    gate.write_text("closed")
    pack = write_pack(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "slow"
        [[workflow.task]]
        name = "t"
        map = {{ count = {count} }}
        run = 'echo $$ > {pids}/$CRUCIBLE_KEY; sleep 300 & echo $! > {pids}/$CRUCIBLE_KEY.child; while [ -e {gate} ]; do sleep 0.05; done; echo "{{}}" > "$CRUCIBLE_OUTPUT"'
        """,
    )
    state = tmp_path / "state"
    proc = start_dispatch(
        pack, state, "-j", "4", *LOCAL, "--threads-per-worker", "2", stderr=tmp_path / "stderr"
    )
    try:
        wait_files(pids, "*.child", 4)
        assert len(list(pids.glob("*.child"))) == 4
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143, (tmp_path / "stderr").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    task_pids = [int(p.read_text()) for p in pids.iterdir()]
    assert not wait_gone(task_pids, 10)
    assert not keyed(state, "t")  # interrupted units stay unsettled
    gate.unlink()
    again = dispatch(pack, state, "--resume", *LOCAL)
    assert again.returncode == 0, again.stderr
    assert len(keyed(state, "t")) == count


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)"
)
def test_a_worker_that_cannot_see_the_state_is_refused_with_exit_3(tmp_path: Path) -> None:
    """A real worker in another mount namespace, where a tmpfs hides the
    directory holding the state (what a worker without the shared mount sees)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    pack = write_pack(tmp_path, FANOUT.format(n=3))
    with cluster(tmp_path) as (address, procs):
        procs.append(start_worker(address))
        wait_workers(address, 1)
        ok = dispatch(pack, shared / "ok", "--executor", "dask", "--scheduler", address)
        assert ok.returncode == 0, ok.stderr
        assert {e.get("worker") for e in events(shared / "ok") if e["event"] == "task_started"}
        procs.append(start_worker(address, hide=shared))
        wait_workers(address, 2)
        bad = dispatch(pack, shared / "bad", "--executor", "dask", "--scheduler", address)
    assert bad.returncode == 3, bad.stderr
    assert bad.stderr.count("\n") == 1 and "Traceback" not in bad.stderr
    assert str(shared / "bad" / "executor-token") in bad.stderr
    assert "Dask worker tcp://127.0.0.1:" in bad.stderr and "cannot see the state" in bad.stderr
    assert not (shared / "bad" / "results").exists()


def test_a_worker_killed_mid_run_is_survived_with_its_unit_retried(tmp_path: Path) -> None:
    # Instance 0's first attempt records its worker and waits; the test SIGKILLs
    # that worker (whose reaper kills the task: test_dask_orphans.py).
    state = tmp_path / "state"
    with Gate(tmp_path / "gate") as gate:
        pack, marks = held_pack(tmp_path, "lost", held=FIRST_OF_0, hold=gate.wait, count=4)
        stderr = tmp_path / "stderr"
        with reaped(start_dispatch(pack, state, "-j", "2", *LOCAL, stderr=stderr)) as proc:
            wait_files(marks, "task", 1)
            time.sleep(0.2)
            os.kill(int((marks / "worker").read_text()), signal.SIGKILL)
            assert proc.wait(timeout=90) == 0, stderr.read_text()
    done = finished(state, key="0")
    assert done[0]["status"] == "failed" and done[0]["retry"] is True
    assert done[0]["note"].startswith("worker lost: tcp://127.0.0.1:")
    assert done[1]["status"] == "passed" and done[1]["attempt"] == 2
    assert len(keyed(state, "t")) == 4


def test_a_timeout_on_a_worker_kills_the_tasks_grandchildren(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pack = write_pack(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "slow"
        [[workflow.task]]
        name = "t"
        timeout = 1
        run = 'sh -c "sleep 300 & echo \\$! >> {pids}; wait" & echo $! >> {pids}; sleep 300'
        """,
    )
    state = tmp_path / "state"
    proc = dispatch(pack, state, *LOCAL)
    assert proc.returncode == 1, proc.stderr
    record = json.loads((state / "results" / "t.json").read_bytes())
    assert record["status"] == "failed" and "timeout" in record["note"]
    grandchildren = [int(p) for p in pids.read_text().split()]
    assert len(grandchildren) == 2
    assert not wait_gone(grandchildren, 10)


def test_a_resource_no_worker_offers_is_refused_at_admission(tmp_path: Path) -> None:
    body = """
    edition = 4
    [workflow]
    name = "r"
    [[workflow.task]]
    name = "small"
    resources = {{ cpus = 1, memory = "1MiB" }}
    run = 'echo "{{}}" > "$CRUCIBLE_OUTPUT"'
    [[workflow.task]]
    name = "big"
    needs = ["small"]
    resources = {{ cpus = 1, gpu = {gpu} }}
    run = 'echo "{{}}" > "$CRUCIBLE_OUTPUT"'
    """
    pack = write_pack(tmp_path, body.format(gpu=1))
    proc = dispatch(pack, tmp_path / "s", *LOCAL)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "task 'big' needs resources cpus=1, gpu=1; no Dask worker offers gpu" in proc.stderr
    assert not (tmp_path / "s" / "results").exists()  # nothing ran
    # what the workers offer (this machine's CPUs and memory) runs
    pack = write_pack(tmp_path, body.format(gpu=0))
    ok = dispatch(pack, tmp_path / "ok", *LOCAL)
    assert ok.returncode == 0, ok.stderr
