"""crucible-ledger end to end: CliRunner for the click layer, real processes for
streams, exit codes, pipes, the Makefile example and a read-only directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from crucible.ledger.cli import cli, main

BIN = Path(sys.executable).parent
LEDGER = str(BIN / "crucible-ledger")
REPO = Path(__file__).resolve().parents[2]


def ledger(
    *args: str, stdin: bytes | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([LEDGER, *args], input=stdin, capture_output=True, timeout=60, cwd=cwd)


def records(directory: Path) -> list[dict[str, object]]:
    path = directory / "steps.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["r"] for line in path.read_bytes().splitlines()]


@pytest.fixture
def d(tmp_path: Path) -> Path:
    directory = tmp_path / "ledger"
    directory.mkdir()
    return directory


COUNTING = "import sys; open(sys.argv[1], 'a').write('x'); print('out'); sys.stderr.write('err\\n'); sys.exit(int(sys.argv[2]))"


def test_run_miss_then_hit_replays_without_running(d: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    argv = [
        "run",
        "--dir",
        str(d),
        "--scope",
        "t",
        "--",
        sys.executable,
        "-c",
        COUNTING,
        str(marker),
        "0",
    ]
    first = ledger(*argv)
    assert first.returncode == 0
    assert first.stdout == b"out\n" and first.stderr == b"err\n"
    second = ledger(*argv)
    assert second.returncode == 0 and second.stdout == b"out\n"
    assert second.stderr.startswith(b"err\ncrucible-ledger: cached: replayed ")
    assert marker.read_text() == "x"  # the command ran once
    [record] = records(d)
    assert record["status"] == "ok" and record["scope"] == "t"
    assert record["value"] == {"exit": 0, "stdout": "out\n", "stderr": "err\n"}


def test_key_parts_and_key_files_change_the_identity(d: Path, tmp_path: Path) -> None:
    marker, keyfile = tmp_path / "ran", tmp_path / "k"
    keyfile.write_text("one")

    def run(*extra: str) -> None:
        cmd = [sys.executable, "-c", COUNTING, str(marker), "0"]
        done = ledger("run", "--dir", str(d), "--scope", "t", *extra, "--", *cmd)
        assert done.returncode == 0

    run("--key", "a=1", "--key-file", str(keyfile))
    run("--key-file", str(keyfile), "--key", "a=1")  # same key, options reordered: replay
    assert marker.read_text() == "x"
    run("--key", "a=2", "--key-file", str(keyfile))
    keyfile.write_text("two")
    run("--key", "a=2", "--key-file", str(keyfile))
    assert marker.read_text() == "xxx"


def test_deterministic_failure_recorded_only_when_listed(d: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    base = ["run", "--dir", str(d), "--scope", "t"]
    cmd = ["--", sys.executable, "-c", COUNTING, str(marker), "4"]
    assert ledger(*base, *cmd).returncode == 4
    assert ledger(*base, *cmd).returncode == 4
    assert marker.read_text() == "xx" and records(d) == []  # unlisted: never recorded
    assert ledger(*base, "--record-exit", "4", *cmd).returncode == 4
    replay = ledger(*base, "--record-exit", "4", *cmd)
    assert replay.returncode == 4 and b"cached" in replay.stderr
    assert marker.read_text() == "xxx"
    assert [r["status"] for r in records(d)] == ["failed"]
    # without --record-exit 4 the recorded failure is no longer a fact: run again
    again = ledger(*base, *cmd)
    assert again.returncode == 4 and b"not a --record-exit code here" in again.stderr
    assert marker.read_text() == "xxxx"


def test_killed_command_is_never_recorded(d: Path) -> None:
    cmd = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    done = ledger("run", "--dir", str(d), "--scope", "t", "--record-exit", "137", "--", *cmd)
    assert done.returncode == 137
    assert b"killed by signal 9; not recorded" in done.stderr
    assert records(d) == []


def test_sigterm_to_the_ledger_is_forwarded_and_nothing_recorded(d: Path) -> None:
    code = "import time; print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen(
        [LEDGER, "run", "--dir", str(d), "--scope", "t", "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    proc.terminate()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert b"interrupted by signal 15; not recorded" in err
    assert records(d) == []


def test_stdin_is_passed_to_the_command(d: Path) -> None:
    done = ledger("run", "--dir", str(d), "--scope", "t", "--", "cat", stdin=b"piped\n")
    assert done.returncode == 0 and done.stdout == b"piped\n"


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ["run", "--dir", "{d}", "--scope", "t", "--key", "oops", "--", "true"],
            2,
            "expected NAME=VALUE",
        ),
        (["run", "--dir", "{d}", "--scope", "t", "--key", "-x=1", "--", "true"], 2, "NAME must be"),
        (
            ["run", "--dir", "{d}", "--scope", "t", "--key-file", "{missing}", "--", "true"],
            2,
            "does not exist",
        ),
        # stdin is CMD's: `-` is refused as a key file, and says so (not "does not exist")
        (
            ["run", "--dir", "{d}", "--scope", "t", "--key-file", "-", "--", "cat"],
            2,
            "--key-file -: stdin belongs to CMD and is never read as a key file; give a file",
        ),
        (["get", "--dir", "{d}", "--scope", "t", "--key-file", "-", "--", "cat"], 2, "give a file"),
        (["run", "--dir", "{d}", "--scope", "t", "--", "{missing}"], 2, "cannot start"),
        (
            ["run", "--dir", "{d}", "--scope", "t", "--record-exit", "0", "--", "true"],
            2,
            "--record-exit 0",
        ),
        (["run", "--dir", "{d}", "--scope", "", "--", "true"], 2, "--scope must not be empty"),
        (["run", "--dir", "{d}", "--scope", "t"], 2, "no command given"),
        (["ls", "--dir", "{file}"], 2, "not a directory"),
        # listed nothing with exit 0 while run/get/put refuse an empty scope
        (["ls", "--dir", "{d}", "--scope", ""], 2, "--scope must not be empty"),
        (["get", "--dir", "{d}", "--scope", "t"], 2, "no command given"),
        (["get", "--dir", "{d}", "--scope", "t", "--step", "x", "--", "true"], 2, "not both"),
        (["put", "--dir", "{d}", "--scope", "t", "--step", "x"], 2, "<stdin>"),
    ],
)
def test_bad_input_is_one_line_and_the_documented_code(
    d: Path, tmp_path: Path, args: list[str], code: int, message: str
) -> None:
    (d / "steps.jsonl").write_bytes(b"")
    before = (d / "steps.jsonl").read_bytes()
    (tmp_path / "file").write_text("")
    subs = {"{d}": str(d), "{missing}": str(tmp_path / "missing"), "{file}": str(tmp_path / "file")}
    done = ledger(*[subs.get(a, a) for a in args], stdin=b"{bad json")
    assert done.returncode == code, done.stderr
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert "Traceback" not in done.stderr.decode()
    assert done.stdout == b""
    assert (d / "steps.jsonl").read_bytes() == before  # nothing recorded, nothing lost


def test_click_usage_errors_exit_2(d: Path) -> None:
    # click's own usage errors keep its format (core.cli shows them), exit 2
    for args, message in (
        (["nonsense"], b"No such command"),
        (["run", "--dir", str(d), "--", "true"], b"Missing option '--scope'"),
        (
            ["run", "--dir", str(d), "--scope", "s", "--record-exit", "x", "--", "true"],
            b"not a valid integer",
        ),
    ):
        done = ledger(*args)
        assert done.returncode == 2 and message in done.stderr and b"Traceback" not in done.stderr
    assert not (d / "steps.jsonl").exists()


def test_put_get_round_trip_with_cached_and_miss_exit_1(d: Path) -> None:
    put = ledger(
        "put",
        "--dir",
        str(d),
        "--scope",
        "s",
        "--step",
        "x",
        stdin=b'{"b": [1, 2.5], "a": "\xc3\xa9"}',
    )
    assert put.returncode == 0, put.stderr
    assert json.loads(put.stdout) == {"scope": "s", "step": "x"}
    got = ledger("get", "--dir", str(d), "--scope", "s", "--step", "x")
    assert got.returncode == 0
    assert (
        got.stdout
        == '{"cached":true,"scope":"s","status":"ok","step":"x","value":{"a":"é","b":[1,2.5]}}\n'.encode()
    )
    miss = ledger("get", "--dir", str(d), "--scope", "s", "--step", "y")
    assert miss.returncode == 1 and miss.stdout == b"" and b"no record" in miss.stderr
    failed = ledger("put", "--dir", str(d), "--scope", "s", "--step", "z", "--failed", stdin=b"1")
    assert failed.returncode == 0
    got = ledger("get", "--dir", str(d), "--scope", "s", "--step", "z")
    assert json.loads(got.stdout)["status"] == "failed"


def test_get_by_command_key_matches_run(d: Path) -> None:
    assert (
        ledger(
            "run", "--dir", str(d), "--scope", "s", "--key", "v=1", "--", "echo", "hi"
        ).returncode
        == 0
    )
    got = ledger("get", "--dir", str(d), "--scope", "s", "--key", "v=1", "--", "echo", "hi")
    assert got.returncode == 0
    assert json.loads(got.stdout)["value"] == {"exit": 0, "stdout": "hi\n", "stderr": ""}


def test_ls_filters_by_scope_and_is_quiet_when_the_reader_closes(d: Path) -> None:
    lines = [json.dumps({"i": i}).encode() for i in range(3)]
    for scope, value in (("a", lines[0]), ("b", lines[1]), ("a", lines[2])):
        assert (
            ledger(
                "put", "--dir", str(d), "--scope", scope, "--step", value.decode(), stdin=value
            ).returncode
            == 0
        )
    listed = ledger("ls", "--dir", str(d), "--scope", "a")
    assert [json.loads(x)["value"] for x in listed.stdout.splitlines()] == [{"i": 0}, {"i": 2}]
    assert len(ledger("ls", "--dir", str(d)).stdout.splitlines()) == 3
    # many records through `| head -1`: exit 0, nothing on stderr
    from crucible.ledger._record import encode_line, make_record

    with open(d / "steps.jsonl", "ab") as f:
        f.writelines(
            encode_line(make_record("bulk", f"s{i}", "ok", "x" * 200)) for i in range(3000)
        )
    done = subprocess.run(
        f"'{LEDGER}' ls --dir '{d}' | head -1; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stderr == b"" and done.stdout.count(b"\n") == 1


def test_verify_and_compact(d: Path) -> None:
    for i in (1, 2):
        ledger("put", "--dir", str(d), "--scope", "s", "--step", "x", stdin=str(i).encode())
    ok = ledger("verify", "--dir", str(d))
    assert ok.returncode == 0
    report = json.loads(ok.stdout)
    assert (report["records"], report["duplicates"], report["damaged"]) == (2, 1, False)
    with open(d / "steps.jsonl", "ab") as f:
        f.write(b'junk\n{"c":"torn')
    bad = ledger("verify", "--dir", str(d))
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["bad"] == [{"line": 3, "reason": "not a ledger line (bad frame)"}]
    assert b"steps.jsonl:3: not a ledger line" in bad.stderr and b"DAMAGED" in bad.stderr
    compacted = ledger("compact", "--dir", str(d))
    assert compacted.returncode == 0
    assert json.loads(compacted.stdout)["kept"] == 1
    assert b"moved to steps.jsonl.rejected-1" in compacted.stderr
    assert (d / "steps.jsonl.rejected-1").read_bytes() == b'junk\n{"c":"torn\n'
    assert ledger("verify", "--dir", str(d)).returncode == 0
    got = ledger("get", "--dir", str(d), "--scope", "s", "--step", "x")
    assert json.loads(got.stdout)["value"] == 2


def test_corrupt_ledger_still_runs_the_command(d: Path) -> None:
    (d / "steps.jsonl").write_bytes(b"\x00\x01 garbage\n")
    done = ledger("run", "--dir", str(d), "--scope", "s", "--", "echo", "fine")
    assert done.returncode == 0 and done.stdout == b"fine\n"
    assert b"quarantined as steps.jsonl.quarantine-" in done.stderr
    [aside] = d.glob("steps.jsonl.quarantine-*")
    assert aside.read_bytes() == b"\x00\x01 garbage\n"
    assert len(records(d)) == 1


def test_read_only_directory_runs_and_returns_the_real_output(d: Path) -> None:
    """As a user who obeys permissions: the append fails, the output is still
    passed through with the command's exit code, the ledger is unchanged."""
    from crucible.ledger import Ledger, Outcome

    shared = Path(tempfile.mkdtemp(prefix="ledger-cli-"))
    try:
        shared.chmod(0o755)
        ro = shared / "ro"
        ro.mkdir()
        with Ledger(ro) as led:
            led.record("s", "seed", Outcome.ok(1))
        before = (ro / "steps.jsonl").read_bytes()
        ro.chmod(0o555)
        out = shared / "out"
        out.mkdir()
        out.chmod(0o777)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child runs the command as nobody
            code = 70
            try:
                fd1 = os.open(out / "stdout", os.O_WRONLY | os.O_CREAT, 0o666)
                fd2 = os.open(out / "stderr", os.O_WRONLY | os.O_CREAT, 0o666)
                os.dup2(fd1, 1)
                os.dup2(fd2, 2)
                sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
                if os.geteuid() == 0:
                    os.setgroups([])
                    os.setgid(65534)
                    os.setuid(65534)
                try:
                    main(
                        [
                            "run",
                            "--dir",
                            str(ro),
                            "--scope",
                            "s",
                            "--",
                            "sh",
                            "-c",
                            "echo real; exit 0",
                        ]
                    )
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert (out / "stdout").read_bytes() == b"real\n"
        err = (out / "stderr").read_text()
        assert "cannot append" in err and "not recorded" in err
        assert (ro / "steps.jsonl").read_bytes() == before
    finally:
        (shared / "ro").chmod(0o755)
        shutil.rmtree(shared)


def test_makefile_example_runs_then_replays(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    example = tmp_path / "ledger-make"
    shutil.copytree(
        REPO / "examples" / "ledger-make", example, ignore=shutil.ignore_patterns("ledger", "*.txt")
    )
    shutil.copy(REPO / "examples" / "ledger-make" / "input.txt", example)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    first = subprocess.run(
        ["make", "DELAY=0"], cwd=example, env=env, capture_output=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    assert b"cached" not in first.stderr
    report = (example / "report.txt").read_bytes()
    assert report == b"lines: 3\nmatches: 0\n"
    again = subprocess.run(
        ["make", "clean", "all", "DELAY=0"], cwd=example, env=env, capture_output=True, timeout=120
    )
    assert again.returncode == 0
    assert again.stderr.count(b"crucible-ledger: cached: replayed") == 3
    assert (example / "report.txt").read_bytes() == report
    assert (
        example / "sorted.txt"
    ).read_bytes() == b"JUMPS OVER\nTHE LAZY DOG\nTHE QUICK BROWN FOX\n"
    assert not (example / "pack.toml").exists()


# -- the click layer through CliRunner -------------------------------------------


def test_clirunner_run_and_ls(d: Path) -> None:
    runner = CliRunner()
    first = runner.invoke(cli, ["run", "--dir", str(d), "--scope", "s", "--", "echo", "hello"])
    assert first.exit_code == 0, first.output
    assert first.stdout_bytes == b"hello\n"
    second = runner.invoke(cli, ["run", "--dir", str(d), "--scope", "s", "--", "echo", "hello"])
    assert second.stdout_bytes == b"hello\n" and "cached" in second.stderr
    listed = runner.invoke(cli, ["ls", "--dir", str(d)])
    assert json.loads(listed.stdout)["key"]["argv"] == ["echo", "hello"]


def test_help_and_version() -> None:
    runner = CliRunner()
    for sub in ([], ["run"], ["get"], ["put"], ["ls"], ["verify"], ["compact"]):
        done = runner.invoke(cli, [*sub, "--help"])
        assert done.exit_code == 0 and "Usage:" in done.output
    assert ledger("--version").stdout.startswith(b"crucible-ledger, version ")
    # --help does not import the library's heavy parts
    probe = "import sys; import crucible.ledger.cli; print(sorted(m for m in ('orjson', 'xxhash', 'crucible.ledger._ledger') if m in sys.modules))"
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
        == "[]"
    )


def test_a_non_command_record_under_a_run_step_is_ignored_and_the_command_runs(d: Path) -> None:
    put = ledger("put", "--dir", str(d), "--scope", "s", "--", "echo", "hi", stdin=b'"odd"')
    assert put.returncode == 0
    done = ledger("run", "--dir", str(d), "--scope", "s", "--", "echo", "hi")
    assert done.returncode == 0 and done.stdout == b"hi\n"
    assert b"is not a command result; running the command" in done.stderr
    replay = ledger("run", "--dir", str(d), "--scope", "s", "--", "echo", "hi")
    assert b"cached" in replay.stderr  # the real result, recorded after, now wins


def test_parallel_runs_as_under_make_j_record_everything(d: Path) -> None:
    procs = [
        subprocess.Popen(
            [LEDGER, "run", "--dir", str(d), "--scope", "j", "--", "echo", f"job {i}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(8)
    ]
    for i, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0 and out == f"job {i}\n".encode()
    report = json.loads(ledger("verify", "--dir", str(d)).stdout)
    assert (report["records"], report["identities"], report["damaged"]) == (8, 8, False)
