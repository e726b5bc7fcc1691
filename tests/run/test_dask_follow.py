"""``--follow`` under ``--executor dask-local`` (issue 19): the tasks' output
lines reach the dispatcher's stderr while the tasks run on the workers, as
with the local executor (the dispatcher tails their logs on the shared
state). Real LocalClusters; every wait is bounded."""

from __future__ import annotations

import collections
import os
import time
from pathlib import Path

import pytest

from crucible.run.executors._log_tail import LogTailer
from tests.run.dasktests import LOCAL, dispatch
from tests.run.dispatchtests import start_dispatch, write_pack

pytest.importorskip("distributed")

PACK = """
edition = 4
[workflow]
name = "fol"
[[workflow.task]]
name = "t"
map = {{ count = 3 }}
retries = 1
run = 'echo "one $CRUCIBLE_KEY"; echo "two $CRUCIBLE_KEY" >&2; printf "partial $CRUCIBLE_ATTEMPT"; if [ "$CRUCIBLE_KEY" = 1 ] && [ "$CRUCIBLE_ATTEMPT" = 1 ]; then exit 1; fi; echo "{{}}" > "$CRUCIBLE_OUTPUT"'
[[workflow.task]]
name = "solo"
run = 'printf "solo out\\n== crucible: attempt 7 looks like a header\\n"; echo "{{}}" > "$CRUCIBLE_OUTPUT"'
"""


def followed(stderr: str) -> collections.Counter[str]:
    return collections.Counter(
        line for line in stderr.splitlines() if not line.startswith("crucible-dispatch:")
    )


def test_follow_shows_the_same_lines_as_the_local_executor(tmp_path: Path) -> None:
    pack = write_pack(tmp_path, PACK.format())
    local = dispatch(pack, tmp_path / "local", "--follow", "-j", "2")
    assert local.returncode == 0, local.stderr
    remote = dispatch(pack, tmp_path / "dask", "--follow", "-j", "2", *LOCAL)
    assert remote.returncode == 0, remote.stderr
    lines = followed(remote.stderr)
    assert lines == followed(local.stderr)
    # each attempt once (the retry's output is not the first attempt's again),
    # the last partial line ended, and no log header
    assert lines["t[1] one 1"] == 2 and lines["t[1] partial 1"] == 1
    assert lines["t[1] partial 2"] == 1 and lines["t[0] two 0"] == 1
    assert lines["solo == crucible: attempt 7 looks like a header"] == 1
    assert not [line for line in lines if line.startswith("== crucible")]


def test_follow_streams_lines_while_the_task_runs(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.write_text("closed")
    pack = write_pack(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "live"
        [[workflow.task]]
        name = "t"
        run = 'echo "first line"; while [ -e {gate} ]; do sleep 0.05; done; echo "after the gate"; echo "{{}}" > "$CRUCIBLE_OUTPUT"'
        """,
    )
    err_path = tmp_path / "stderr"
    proc = start_dispatch(pack, tmp_path / "state", "--follow", *LOCAL, stderr=err_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "t first line" not in err_path.read_text():
            assert proc.poll() is None, err_path.read_text()
            time.sleep(0.05)
        # seen while the task still waits at its gate
        assert "t first line" in err_path.read_text()
        assert "after the gate" not in err_path.read_text()
        gate.unlink()
        assert proc.wait(timeout=60) == 0, err_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    assert "t after the gate" in err_path.read_text()


def test_the_tailer_skips_a_log_that_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO planted as a unit's log is never opened for reading (it would
    block) nor followed: nothing is shown and the dispatcher does not hang."""
    fifo = tmp_path / "t.log"
    os.mkfifo(fifo)
    read_end, write_end = os.pipe()
    tailer = LogTailer(fd=write_end, interval=0.01)
    tailer.add(1, fifo, "t", None)
    time.sleep(0.1)
    tailer.finish(1)
    tailer.close()
    os.close(write_end)
    with os.fdopen(read_end, "rb") as shown:
        assert shown.read() == b""
