"""Issue 27 item 21: SIGTERM is one line and exit 143 wherever it lands — while the
tool loads (it ended the process silently) and once the command runs (a
KeyboardInterrupt's cleanups run for it too) — as SIGINT is one line and 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.core.test_cli_edge import _SLOW_CLICK

BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "argv", [["crucible-dispatch", "pack.toml", "--state", "s"], ["crucible-compile", "pack.toml"]]
)
def test_sigterm_while_the_tool_loads_is_143_with_one_line(tmp_path: Path, argv: list[str]) -> None:
    shim = tmp_path / "shim" / "click"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(_SLOW_CLICK)
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shim"), "CRUCIBLE_TEST_READY": str(ready)}
    proc = subprocess.Popen(
        [BIN / argv[0], *argv[1:]],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert ready.exists(), proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err == f"{argv[0]}: interrupted by SIGTERM\n" and out == ""
    assert not (tmp_path / "s").exists()


def test_sigterm_inside_the_command_is_143_with_one_line_after_cleanups(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        sys.argv[0] = "crucible-probe"
        import crucible
        import click
        from crucible.core.cli import run

        @click.command()
        def probe():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(30)
            finally:
                print("cleaned", flush=True)

        run(probe, "crucible-probe")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 143, done.stderr
    assert done.stderr == "crucible-probe: interrupted by SIGTERM\n"
    assert done.stdout == "cleaned\n"


def test_a_sigterm_ignored_by_the_parent_stays_ignored(tmp_path: Path) -> None:
    script = "import sys, signal; sys.argv[0] = 'crucible-x'; import crucible; " + (
        "print(signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
    )
    assert done.stdout == "True\n", done.stderr
