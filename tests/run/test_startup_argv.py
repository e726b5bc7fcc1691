"""``crucible-dispatch``'s click-free command line (run/_argv.py, issue 14 start-up):
what it accepts it turns into exactly the options click gives, and it hands
everything else to click (help, version, every usage error)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from crucible.core.cli import run as run_edge
from crucible.run import _argv, commands
from crucible.run._options import JOBS_MAX
from crucible.run.cli import cli

DISPATCH = str(Path(sys.executable).parent / "crucible-dispatch")
PLAN = '{"edition":3,"tasks":[],"version":2,"workflow":{"name":"t","params":{}}}'


def one_task(run: str) -> str:
    """A plan of one command task named ``t``."""
    return (
        '{"edition":3,"tasks":[{"emits":{},"emits_files":[],"epilogue":false,"join":"all",'
        f'"kind":"command","name":"t","needs":[],"retries":0,"run":"{run}"}}],'
        '"version":2,"workflow":{"name":"t","params":{}}}'
    )


def _click_options(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> commands.DispatchOptions | int:
    """The options click builds for ``args`` (run_run captured), or its exit code."""
    seen: list[commands.DispatchOptions] = []

    def capture(opts: commands.DispatchOptions, out: Any, err: Any) -> int:
        seen.append(opts)
        return 0

    monkeypatch.setattr(commands, "run_run", capture)
    try:
        run_edge(cli, "crucible-dispatch", args)
    except SystemExit as exc:
        if seen:
            return seen[0]
        return int(exc.code) if isinstance(exc.code, int) else 0
    raise AssertionError("the edge always exits")


@pytest.fixture
def where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CRUCIBLE_CACHE", raising=False)
    (tmp_path / "plan.json").write_text(PLAN)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    return tmp_path


ACCEPTED = [
    ["plan.json", "--state", "s"],
    ["plan.json", "--state=s", "-j2"],
    ["plan.json", "--state", "s", "-j", "2"],
    ["plan.json", "--state", "s", "--jobs=256"],
    ["run", "plan.json", "--state", "s", "--jobs", "007"],
    ["--state", "s", "plan.json", "-n", "--json"],
    ["--state", "adir", "run"],  # options first: a plan named like a subcommand
    ["plan.json", "-p", "a=1", "-pb=2", "--params", "-", "--state", "s"],
    ["plan.json", "--state", "s", "--target", "x", "--target=y", "--fail-fast", "--follow"],
    ["plan.json", "--state", "s", "--resume", "--retry-failed", "--keep-workspaces"],
    ["plan.json", "--state", "s", "--fresh", "--dry-run", "--emit-cap", "10"],
    ["plan.json", "--state", "s", "--reuse", "-n", "--all"],
    ["plan.json", "--state", "s", "--events", "-", "--outputs", "out.json"],
    ["plan.json", "--state", "s", "--publish-dir", "adir", "--cache", "c", "--agent-cmd", "cat"],
    ["plan.json", "--state", "s", "--cache", "afile"],
    ["plan.json", "--state", "s", "--executor", "dask-local", "--workers", "2"],
    ["plan.json", "--state", "s", "--executor=dask", "--scheduler", "tcp://h:1"],
    ["plan.json", "--state", "s", "--threads-per-worker", "3", "--executor", "local"],
    # the emit cap is text to both parsers: admission checks it (core.contract)
    ["plan.json", "--state", "s", "--emit-cap", "0"],
]

DECLINED = [
    [],
    ["--help"],
    ["-h"],
    ["--version"],
    ["plan.json", "--state", "s", "--help"],
    ["plan.json", "--state", "s", "--debug"],
    ["report", "s"],
    ["cache", "gc"],
    ["reprot", "--state", "s"],  # names nothing: click's "no such command or file"
    ["plan.json"],  # no --state
    ["run", "--state", "s"],  # no PLAN
    ["plan.json", "other.json", "--state", "s"],
    ["plan.json", "--state", "s", "--bogus"],
    ["plan.json", "--state", "s", "-nj2"],
    ["plan.json", "--state", "s", "--resume=yes"],
    ["plan.json", "--state", "s", "--state", "t"],
    ["plan.json", "--state", "s", "-j"],
    ["plan.json", "--state", "s", "-j", "0"],
    ["plan.json", "--state", "s", "-j", "257"],
    ["plan.json", "--state", "s", "-j", "+2"],
    ["plan.json", "--state", "s", "-j", " 2"],
    ["plan.json", "--state", "s", "-j", "2_0"],
    ["plan.json", "--state", "s", "-j", "\u0662"],
    ["plan.json", "--state", ""],
    ["plan.json", "--state", "-x"],
    ["plan.json", "--state", "afile"],  # a file where a dir is wanted
    ["adir", "--state", "s"],  # a dir where the plan file is wanted
    ["plan.json", "--state", "s", "--publish-dir", "afile"],
    ["plan.json", "--state", "s", "--executor", "Local"],
    ["plan.json", "--state", "s", "--", "x"],
    ["plan.json", "--state", "s", "-"],
]


@pytest.mark.parametrize("args", ACCEPTED, ids=" ".join)
def test_an_accepted_command_line_gives_clicks_options(
    where: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    values = _argv.parse(args)
    assert values is not None, args
    assert commands.dispatch_options(**values) == _click_options(monkeypatch, args)


@pytest.mark.parametrize("args", DECLINED, ids=" ".join)
def test_anything_else_is_left_to_click(where: Path, args: list[str]) -> None:
    assert _argv.parse(args) is None


def test_every_order_of_the_common_options_gives_clicks_options(
    where: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pieces = [["--state", "s"], ["-j2"], ["--fail-fast"], ["-p", "a=b"]]
    for order in itertools.permutations(pieces):
        args = ["plan.json", *itertools.chain.from_iterable(order)]
        values = _argv.parse(args)
        assert values is not None, args
        assert commands.dispatch_options(**values) == _click_options(monkeypatch, args)


def test_the_cache_from_the_environment_is_clicks(
    where: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = ["plan.json", "--state", "s"]
    for value, taken in (("envcache", True), ("", True), ("afile", True), ("-x", False)):
        monkeypatch.setenv("CRUCIBLE_CACHE", value)
        values = _argv.parse(args)
        assert (values is not None) is taken, value
        if values is not None:
            assert commands.dispatch_options(**values) == _click_options(monkeypatch, args)


def test_an_unreadable_path_is_left_to_click(where: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    (where / "plan.json").chmod(0)
    assert _argv.parse(["plan.json", "--state", "s"]) is None


def _dispatch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [DISPATCH, *args], capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def test_the_program_exits_with_the_runs_code_and_its_last_line(tmp_path: Path) -> None:
    """The fast path ends by os._exit (core.cli fast_exit): the exit code, the
    summary on stderr and the records are those of a normal exit."""
    plan = tmp_path / "plan.json"
    plan.write_text(one_task("exit 3"))
    done = _dispatch(str(plan), "--state", "s", "-j2", cwd=tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.startswith("crucible-dispatch: run failed: 0 passed, 1 failed")
    assert done.stderr.count("\n") == 1
    assert (tmp_path / "s" / "results" / "t.json").is_file()
    again = _dispatch(str(plan), "--state", "s", "-j2", cwd=tmp_path)  # not --resume
    assert again.returncode == 1
    assert again.stderr.count("\n") == 1 and "error:" in again.stderr


def test_atexit_handlers_still_run_at_the_fast_exit(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(one_task("true"))
    probe = (
        "import atexit, sys\n"
        "atexit.register(lambda: sys.stdout.write('handler ran\\n'))\n"
        "sys.argv[0] = 'crucible-dispatch'\n"
        "from crucible.run.cli import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(plan), "--state", str(tmp_path / "s")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "handler ran\n"


_LEAVES_A_FILE_OPEN = (
    "import sys\n"
    "left = open(sys.argv.pop(1), 'w')\n"
    "left.write('buffered, never flushed')\n"
    "sys.argv[0] = 'crucible-dispatch'\n"
    "from crucible.run.cli import main\n"
    "main()\n"
)


@pytest.mark.parametrize("check", ["1", "0"])
def test_a_file_left_open_is_caught_at_the_fast_exit(tmp_path: Path, check: str) -> None:
    """os._exit drops a buffer Python still holds. With CRUCIBLE_CHECK_EXIT=1
    (every command the suite runs) a writable file left open is named and the
    exit is the normal one, with code 70, which flushes it; without, the fast
    exit loses its buffer, which is why the suite checks."""
    plan = tmp_path / "plan.json"
    plan.write_text(one_task("true"))
    left = tmp_path / "left.txt"
    done = subprocess.run(
        [sys.executable, "-c", _LEAVES_A_FILE_OPEN, str(left), str(plan), "--state", "s"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "CRUCIBLE_CHECK_EXIT": check},
    )
    if check == "1":
        assert done.returncode == 70, done.stderr
        assert done.stderr.splitlines()[-1] == f"crucible-dispatch: bug: left open at exit: {left}"
        assert left.read_text() == "buffered, never flushed"
    else:
        assert done.returncode == 0, done.stderr
        assert left.read_text() == ""


def test_the_fast_parser_knows_each_of_clicks_options_as_click_does() -> None:
    """Every option of click's ``run`` is either one the fast parser reads, with
    click's destination and arity (a flag, a value, a repeated value), or one
    it declines (help, version, debug). A new option added to click alone
    fails here until the fast parser reads it (or declines it on purpose)."""
    import click

    run_cmd = cli.commands["run"]  # type: ignore[attr-defined]
    declined = {"--help", "-h", "--version", "--debug"}
    seen: set[str] = set()
    for param in run_cmd.params:
        if not isinstance(param, click.Option):
            assert param.name == "plan"
            continue
        for decl in param.opts + param.secondary_opts:
            seen.add(decl)
            if decl in declined:
                continue
            if param.is_flag:
                assert _argv._FLAGS.get(decl) == param.name, decl
            else:
                name, kind = _argv._VALUED[decl]
                assert name == param.name, decl
                assert (kind == "texts") is param.multiple, decl
                if kind in ("slots", "count"):  # the same range as click's
                    assert isinstance(param.type, click.IntRange), decl
                    top = JOBS_MAX if kind == "slots" else None
                    assert (param.type.min, param.type.max) == (1, top), decl
    known = set(_argv._FLAGS) | set(_argv._VALUED)
    assert known <= seen, known - seen  # nothing the fast parser reads is gone from click
    executor = next(p for p in run_cmd.params if p.name == "executor")
    assert tuple(executor.type.choices) == _argv._EXECUTORS
