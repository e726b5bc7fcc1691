"""The tee runner: live pass-through, capture, what is settled."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from crucible.ledger._runner import (
    CannotStart,
    CommandResult,
    command_outcome,
    decode_streams,
    run_command,
)

PY = sys.executable


class ReleaseOnFirst(io.BytesIO):
    """A sink that creates ``release`` when the first output arrives: the child
    waits for that file, so only live pass-through lets it finish quickly."""

    def __init__(self, release: Path) -> None:
        super().__init__()
        self.release = release

    def write(self, data: bytes) -> int:  # type: ignore[override]
        self.release.touch()
        return super().write(data)


def test_output_is_passed_through_live_and_captured(tmp_path: Path) -> None:
    release = tmp_path / "release"
    code = (
        "import os, sys, time\n"
        "print('first', flush=True)\n"
        "deadline = time.time() + 20\n"
        "while not os.path.exists(sys.argv[1]):\n"
        "    if time.time() > deadline: sys.exit(9)\n"
        "    time.sleep(0.01)\n"
        "print('second'); sys.stderr.write('err\\n')\n"
    )
    out, err = ReleaseOnFirst(release), io.BytesIO()
    start = time.monotonic()
    result = run_command([PY, "-c", code, str(release)], stdout=out, stderr=err)
    assert time.monotonic() - start < 10
    assert result.exit_code == 0
    assert out.getvalue() == result.stdout == b"first\nsecond\n"
    assert err.getvalue() == result.stderr == b"err\n"


def test_binary_output_round_trips_through_base64() -> None:
    data = bytes(range(256))
    code = "import sys; sys.stdout.buffer.write(bytes(range(256))); sys.exit(3)"
    result = run_command([PY, "-c", code], stdout=io.BytesIO(), stderr=io.BytesIO())
    outcome = command_outcome(result, {3})
    assert outcome.settled and outcome.status == "failed"
    assert "stdout_base64" in outcome.value and outcome.value["stderr"] == ""
    assert decode_streams(outcome.value) == (3, data, b"")


def _result(**kw: object) -> CommandResult:
    base: dict[str, object] = dict(
        exit_code=0, signal=None, stdout=b"", stderr=b"", overflow=False, interrupted_by=None
    )
    base.update(kw)
    return CommandResult(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("result", "record_exits", "settled", "status", "shell"),
    [
        (_result(), set(), True, "ok", 0),
        (_result(exit_code=2), set(), False, "failed", 2),
        (_result(exit_code=2), {2}, True, "failed", 2),
        (_result(exit_code=None, signal=9), {137, 9}, False, "failed", 137),
        (_result(interrupted_by=15), set(), False, "ok", 143),
        (_result(exit_code=1, interrupted_by=2), {1}, False, "failed", 1),
        (_result(overflow=True), set(), False, "ok", 0),
    ],
)
def test_only_settled_facts_are_recordable(
    result: CommandResult, record_exits: set[int], settled: bool, status: str, shell: int
) -> None:
    outcome = command_outcome(result, record_exits)
    assert (outcome.settled, outcome.status, outcome.value["exit"]) == (settled, status, shell)


def test_killed_by_a_signal_is_reported_not_settled() -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    result = run_command([PY, "-c", code], stdout=io.BytesIO(), stderr=io.BytesIO())
    assert result.exit_code is None and result.signal == signal.SIGKILL
    assert result.shell_status == 137
    assert not command_outcome(result, {137}).settled


def test_our_sigterm_is_forwarded_and_nothing_is_settled() -> None:
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    try:
        code = "import time; print('up', flush=True); time.sleep(30)"
        result = run_command([PY, "-c", code], stdout=io.BytesIO(), stderr=io.BytesIO())
    finally:
        timer.cancel()
    assert result.interrupted_by == signal.SIGTERM and result.signal == signal.SIGTERM
    assert result.shell_status == 143
    assert not command_outcome(result, set()).settled
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored


def test_output_over_the_capture_limit_passes_through_but_is_not_settled() -> None:
    out = io.BytesIO()
    code = "import sys; sys.stdout.write('x' * 5000)"
    result = run_command([PY, "-c", code], stdout=out, stderr=io.BytesIO(), limit=1000)
    assert out.getvalue() == b"x" * 5000
    assert result.overflow and not command_outcome(result, set()).settled


def test_closed_reader_stops_pass_through_not_capture() -> None:
    class Closed(io.BytesIO):
        def write(self, data: bytes) -> int:  # type: ignore[override]
            raise BrokenPipeError

    result = run_command([PY, "-c", "print('hi')"], stdout=Closed(), stderr=io.BytesIO())
    assert result.stdout == b"hi\n" and result.exit_code == 0


def test_closed_reader_and_capture_over_the_limit_end_an_endless_command() -> None:
    # `crucible-ledger run -- yes | head -c1` used to drain `yes` forever: once the
    # reader is gone and the capture is abandoned, the command must get SIGPIPE.
    class Closed(io.BytesIO):
        def write(self, data: bytes) -> int:  # type: ignore[override]
            raise BrokenPipeError

    code = (
        "import signal, sys\n"
        "signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as `yes` has it\n"
        "while True: sys.stdout.write('y\\n' * 4096)"
    )
    box: list[CommandResult] = []
    worker = threading.Thread(
        target=lambda: box.append(
            run_command([PY, "-c", code], stdout=Closed(), stderr=io.BytesIO(), limit=100_000)
        ),
        daemon=True,
    )
    worker.start()
    worker.join(30)
    assert box, "the command was drained forever"
    (result,) = box
    assert result.overflow and result.signal == signal.SIGPIPE
    assert result.shell_status == 128 + signal.SIGPIPE
    assert not command_outcome(result, set()).settled


def test_commands_that_cannot_start(tmp_path: Path) -> None:
    with pytest.raises(CannotStart, match="No such file") as missing:
        run_command([str(tmp_path / "nope")], stdout=io.BytesIO(), stderr=io.BytesIO())
    assert missing.value.usage
    script = tmp_path / "script"
    script.write_text("echo hi\n")  # not executable
    with pytest.raises(CannotStart, match="Permission denied") as denied:
        run_command([str(script)], stdout=io.BytesIO(), stderr=io.BytesIO())
    assert denied.value.usage


def test_decode_streams_refuses_malformed_values() -> None:
    assert decode_streams({"exit": 0, "stdout": "a", "stderr": "b"}) == (0, b"a", b"b")
    assert decode_streams({"exit": "0", "stdout": "", "stderr": ""}) is None
    assert decode_streams({"exit": 0, "stdout": ""}) is None
    assert decode_streams({"exit": 0, "stdout": "", "stderr_base64": "!!"}) is None
    assert decode_streams([1]) is None
    assert decode_streams({"exit": 256, "stdout": "", "stderr": ""}) is None


EARLY_SIGNAL = r"""
import os, signal, subprocess, sys
from crucible.ledger import _runner as runner

real = subprocess.Popen

class Popen(real):
    # a SIGTERM that lands the moment the command has started, before anything
    # else runs: the window a loaded machine opens
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)

runner.subprocess.Popen = Popen
result = runner.run_command(
    [sys.executable, "-c", "import time; time.sleep(60)"],
    stdout=sys.stdout.buffer, stderr=sys.stderr.buffer,
)
print(result.interrupted_by, result.signal, flush=True)
"""


def test_a_signal_as_the_command_starts_is_forwarded_not_fatal() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", EARLY_SIGNAL], capture_output=True, text=True, timeout=60
    )
    # before the fix: killed by SIGTERM (-15) with the command left running
    assert done.returncode == 0, (done.returncode, done.stderr)
    assert done.stdout == "15 15\n"
