from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import click
import pytest

from crucible.core import cli
from crucible.core.errors import (
    CrucibleError,
    InputRefused,
    Interrupted,
    OperationalError,
    ParseError,
    UsageError,
)


def _command(exc: BaseException | None = None, ret: int | None = None) -> click.Command:
    @click.command()
    @click.option("--n", type=int, default=0)
    def cmd(n: int) -> int | None:
        if exc is not None:
            raise exc
        return ret

    return cmd


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (InputRefused("bad", where="a.toml:3:1"), 1),
        (ParseError("cannot parse"), 2),
        (UsageError("no"), 2),
        (OperationalError("disk"), 3),
        (Interrupted("stop", signum=15), 143),
        (RuntimeError("oops"), 70),
    ],
)
def test_exceptions_map_to_exit_codes(
    exc: BaseException, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        cli.run(_command(exc), "crucible-x", [])
    assert info.value.code == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("crucible-x: ")
    if isinstance(exc, CrucibleError) and exc.where:
        assert "a.toml:3:1: bad" in err
    if code == 70:
        assert "--debug" in err and "Traceback" not in err


def test_click_usage_error_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.run(_command(), "crucible-x", ["--n", "notanint"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("crucible-x: error: ") and "'notanint'" in err and "--help" in err


def test_return_value_is_exit_code() -> None:
    with pytest.raises(SystemExit) as info:
        cli.run(_command(ret=1), "crucible-x", [])
    assert info.value.code == 1


def test_debug_reraises() -> None:
    with pytest.raises(RuntimeError):
        cli.run(_command(RuntimeError("x")), "crucible-x", ["--debug"])


def test_broken_pipe_is_quiet(tmp_path: Path) -> None:
    script = tmp_path / "spew.py"
    script.write_text(
        textwrap.dedent(
            """
            import click, sys
            from crucible.core import cli

            @click.command()
            def spew() -> None:
                for i in range(200000):
                    sys.stdout.write(f"line {i}\\n")

            cli.run(spew, "spew")
            """
        )
    )
    proc = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} {script} | head -n 1"],
        capture_output=True,
        text=True,
    )
    assert proc.stdout == "line 0\n"
    assert proc.stderr == ""
    assert proc.returncode == 0


def test_umbrella_help_and_unknown_tool() -> None:
    exe = Path(sys.executable).parent / "crucible"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "compile" in out.stdout
    bad = subprocess.run([exe, "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown tool 'nope'" in bad.stderr
    version = subprocess.run([exe, "--version"], capture_output=True, text=True)
    assert version.stdout.startswith("crucible ")
    tool_help = subprocess.run([exe, "help", "ledger"], capture_output=True, text=True)
    assert tool_help.returncode == 0 and "crucible-ledger" in tool_help.stdout
    debug = subprocess.run([exe, "--debug", "compile", "--version"], capture_output=True, text=True)
    assert debug.returncode == 0, debug.stderr


def _sh(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)


BIN = Path(sys.executable).parent


def test_closed_stdout_is_not_an_error(tmp_path: Path) -> None:
    pack = tmp_path / "p.toml"
    pack.write_text(
        'edition = 3\n[workflow]\nname = "x"\n[[workflow.task]]\nname = "a"\nrun = "true"\n'
    )
    done = _sh(f"{BIN}/crucible-compile {pack} >&-")
    assert done.returncode == 0, done.stderr


def test_full_disk_under_stdout_is_operational(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    pack = tmp_path / "p.toml"
    pack.write_text(
        'edition = 3\n[workflow]\nname = "x"\n[[workflow.task]]\nname = "a"\nrun = "true"\n'
    )
    done = _sh(f"{BIN}/crucible-compile --graph dot {pack} > /dev/full")
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "I/O error" in done.stderr


def test_closed_stderr_pipe_keeps_the_refusal(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[workflow]\nname = 1\n" + "".join(f"x{i} = 1\n" for i in range(50)))
    done = _sh(
        f"set -o pipefail; {BIN}/crucible-validate {bad} 2>&1 >/dev/null | head -c 1 >/dev/null"
    )
    assert done.returncode == 1


def test_closed_stderr_still_runs_the_command(tmp_path: Path) -> None:
    done = _sh(f"{BIN}/crucible-ledger run --dir {tmp_path} --scope s -- echo hi 2>&-")
    assert done.returncode == 0
    assert done.stdout == "hi\n"


def test_debug_after_double_dash_stays_in_the_childs_argv(tmp_path: Path) -> None:
    # issue 11 item 2: `--debug` used to be stripped from anywhere in argv
    ledger = tmp_path / "l"
    ledger.mkdir()
    argvs: list[list[str | Path]] = [
        [BIN / "crucible-ledger", "run"],
        [BIN / "crucible", "--debug", "ledger", "run"],
    ]
    for argv in argvs:
        proc = subprocess.run(
            [*argv, "--dir", ledger, "--scope", "s", "--", "echo", "hello", "--debug"],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == "hello --debug\n"
    listed = subprocess.run(
        [BIN / "crucible-ledger", "ls", "--dir", ledger], capture_output=True, text=True
    )
    records = [line for line in listed.stdout.splitlines() if line]
    assert records and all('"argv":["echo","hello","--debug"]' in r for r in records)


def test_debug_is_a_real_option_of_every_command() -> None:
    commands = [
        ["crucible-compile"],
        ["crucible-validate"],
        ["crucible-verify"],
        ["crucible-prove"],
        ["crucible-ledger"],
        ["crucible-ledger", "run"],
        ["crucible-ledger", "ls"],
        ["crucible-stage"],
        ["crucible-stage", "inputs"],
        ["crucible-dispatch", "report"],
    ]
    for argv in commands:
        proc = subprocess.run([BIN / argv[0], *argv[1:], "--help"], capture_output=True, text=True)
        assert proc.returncode == 0 and "--debug" in proc.stdout, argv


def test_debug_option_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError):
        cli.run(_command(RuntimeError("x")), "crucible-x", ["--n", "1", "--debug"])
    # and it lasts one run: the next run without it is one line, exit 70
    with pytest.raises(SystemExit) as info:
        cli.run(_command(RuntimeError("x")), "crucible-x", [])
    assert info.value.code == 70


@pytest.mark.parametrize(
    "argv",
    [
        ["crucible-ledger"],
        ["crucible-stage"],
        ["crucible-dispatch"],
        ["crucible", "ledger"],
        ["crucible", "stage"],
        ["crucible"],
    ],
)
def test_no_subcommand_is_one_line_with_the_help_hint(argv: list[str]) -> None:
    # issue 12 item 30: "error: Usage:" and the whole help block
    proc = subprocess.run(
        [BIN / argv[0], *argv[1:]], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    name = "crucible" if argv == ["crucible"] else f"crucible-{argv[-1].removeprefix('crucible-')}"
    assert line.startswith(f"{name}: error: missing ") and f"(see '{name} --help')" in line


_SLOW_CLICK = '''
import os, sys, time
here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
open(os.environ["CRUCIBLE_TEST_READY"], "w").close()
# until the test's SIGINT ends the process (a fixed short stall was a window a
# loaded machine let the signal miss: the tool then finished, exit 0, 2 or 3)
time.sleep(float(os.environ.get("CRUCIBLE_TEST_STALL", "120")))
sys.path.remove(here)
del sys.modules["click"]
import click as _real
sys.modules["click"] = _real
'''


@pytest.mark.parametrize(
    "argv",
    [
        ["crucible-compile", "pack.toml"],
        ["crucible-verify", "bundle"],
        ["crucible-ledger", "ls", "--dir", "l"],
        ["crucible", "ledger", "ls", "--dir", "l"],
    ],
)
def test_sigint_while_the_tool_loads_is_130_with_one_line(tmp_path: Path, argv: list[str]) -> None:
    # issue 12 item 24: a KeyboardInterrupt traceback (exit 1, or death by signal)
    # when Ctrl-C came while click and the tool were still being imported. A click
    # that stalls on import holds the command in that window until the signal.
    import signal
    import time

    shim = tmp_path / "shim" / "click"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(_SLOW_CLICK)
    ready = tmp_path / "ready"
    env = {
        **os.environ,
        "PYTHONPATH": str(tmp_path / "shim"),
        "CRUCIBLE_TEST_READY": str(ready),
    }
    proc = subprocess.Popen(
        [BIN / argv[0], *argv[1:]],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a terminal's Ctrl-C: the test runner itself may run with SIGINT
        # ignored (a background job of a shell), which the child would inherit
        # and the tool rightly keep (crucible/__init__: _guard_startup)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert ready.exists(), proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    # (the umbrella has handed over to crucible-ledger by the time it imports click)
    prog = argv[0] if argv[0] != "crucible" else f"crucible-{argv[1]}"
    assert err == f"{prog}: interrupted\n" and out == ""


def test_sigint_after_the_edge_still_reaches_cleanup() -> None:
    # the startup guard is given back to Python at the edge: a command sees
    # KeyboardInterrupt (temp files removed, interrupted runs recorded)
    import signal

    import crucible

    prior = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, crucible._interrupted_early)
    try:
        seen: list[object] = []

        @click.command()
        def cmd() -> None:
            seen.append(signal.getsignal(signal.SIGINT))

        with pytest.raises(SystemExit):
            cli.run(cmd, "crucible-x", [])
        assert seen == [signal.default_int_handler]
    finally:
        signal.signal(signal.SIGINT, prior)
