"""Issue 27 item 6 at run time: the longest durations a pack may set (365 days,
manifest.md "Durations") are waited for in slices a poll can hold, never an
``OverflowError: timeout is too large`` (exit 70)."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

from crucible.compile._durations import MAX_DURATION_S
from tests.run.dispatchtests import DISPATCH, reaped, start_dispatch, wait_for, write_pack

HEAD = 'edition = 4\n[workflow]\nname = "long"\n[[workflow.task]]\n'


def test_a_task_with_the_longest_timeout_runs(tmp_path: Path) -> None:
    pack = write_pack(
        tmp_path, HEAD + f'name = "a"\nrun = "sleep 0.2"\ntimeout = {MAX_DURATION_S}\n'
    )
    done = subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_a_retry_a_year_away_waits_and_stops_on_sigterm(tmp_path: Path) -> None:
    pack = write_pack(
        tmp_path,
        HEAD + f'name = "b"\nrun = "exit 1"\nretry = {{ limit = 1, delay = {MAX_DURATION_S} }}\n',
    )
    state = tmp_path / "s"
    err = tmp_path / "err"
    with reaped(start_dispatch(pack, state, stderr=err)) as proc:
        log = state / "session.jsonl"
        wait_for(lambda: log.exists() and b'"retry":true' in log.read_bytes())
        assert proc.poll() is None, err.read_text()  # waiting, not crashed
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 143, err.read_text()
    assert "Traceback" not in err.read_text() and "a bug" not in err.read_text()
