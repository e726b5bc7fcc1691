"""crucible-compile and crucible-validate: CliRunner and real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from crucible.compile import compile_path
from crucible.compile.cli import compile_command, validate_command
from crucible.core import digest
from tests.cli.edgetests import as_nobody

BIN = Path(sys.executable).parent
COMPILE = str(BIN / "crucible-compile")
VALIDATE = str(BIN / "crucible-validate")

GOOD = """
edition = 3

[workflow]
name = "cli"

[[workflow.task]]
name = "list"
run = ["sh", "-c", "echo"]
emits = { items = "array" }

[[workflow.task]]
name = "each"
needs = ["list"]
map = "list.items"
run = "echo"
emits = { v = "string" }

[[workflow.task]]
name = "join"
needs = ["each"]
join = "settled"
run = "true"
inputs = { vs = "each.v" }

[[workflow.task]]
name = "fin"
kind = "agent"
prompt = "report"
epilogue = true
"""

BAD = """
[workflow]
name = "bad"

[[workflow.task]]
name = "../up"
run = "true"
needs = ["ghost"]
colour = "red"
"""


def write(tmp_path: Path, text: str, name: str = "pack.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(list(args), input=stdin, capture_output=True, timeout=60, check=False)


def test_compile_prints_canonical_plan(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    result = CliRunner().invoke(compile_command, [str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout_bytes == compile_path(path).data
    assert result.stderr == ""


def test_compile_digest_only(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    proc = run(COMPILE, "--digest", str(path))
    assert proc.returncode == 0
    assert proc.stdout == (compile_path(path).digest + "\n").encode()
    plan = run(COMPILE, str(path)).stdout
    assert proc.stdout.decode().strip() == digest.of_bytes(plan)


def test_compile_reads_stdin(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    proc = run(COMPILE, "-", stdin=path.read_bytes())
    assert proc.returncode == 0 and proc.stdout == compile_path(path).data
    proc = run(COMPILE, stdin=path.read_bytes())
    assert proc.returncode == 0 and proc.stdout == compile_path(path).data


def test_output_file_atomic_and_untouched_when_identical(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    out = tmp_path / "plan.json"
    assert run(COMPILE, str(path), "-o", str(out)).returncode == 0
    assert out.read_bytes() == compile_path(path).data
    os.utime(out, (1_000_000, 1_000_000))
    inode = out.stat().st_ino
    proc = run(COMPILE, str(path), "-o", str(out))
    assert proc.returncode == 0 and proc.stdout == b""
    assert out.stat().st_mtime == 1_000_000 and out.stat().st_ino == inode
    # a changed pack replaces the file (a new inode: written beside it and renamed)
    write(tmp_path, GOOD.replace('name = "cli"', 'name = "cli2"'))
    assert run(COMPILE, str(path), "-o", str(out)).returncode == 0
    assert out.stat().st_mtime != 1_000_000
    assert json.loads(out.read_bytes())["workflow"]["name"] == "cli2"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_failed_compile_leaves_existing_output(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    out.write_bytes(b"old")
    proc = run(COMPILE, str(write(tmp_path, BAD)), "-o", str(out))
    assert proc.returncode == 1
    assert out.read_bytes() == b"old"


def test_compile_errors_one_line_each(tmp_path: Path) -> None:
    path = write(tmp_path, BAD)
    proc = run(COMPILE, str(path))
    assert proc.returncode == 1 and proc.stdout == b""
    lines = proc.stderr.decode().splitlines()
    assert all(line.startswith(f"crucible-compile: error: {path}:") for line in lines[:-1])
    codes = {line.rsplit("[", 1)[1].rstrip("]") for line in lines if "error" in line}
    assert {"name-separator", "unknown-key"} <= codes
    assert "Traceback" not in proc.stderr.decode()


def test_edition_1_warning_is_one_stderr_line(tmp_path: Path) -> None:
    path = write(
        tmp_path, GOOD.replace("edition = 3", "").replace('inputs = { vs = "each.v" }', "")
    )
    proc = run(COMPILE, str(path))
    assert proc.returncode == 0
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith("crucible-compile: warning: ") and "edition = 3" in line
    assert proc.stdout == compile_path(path).data


@pytest.mark.parametrize(
    ("content", "needle"),
    [("[workflow\nname = 1\n", ":1:"), (None, "no such file")],
)
def test_malformed_or_missing_is_exit_2_one_line(
    tmp_path: Path, content: str | None, needle: str
) -> None:
    path = tmp_path / "pack.toml"
    if content is not None:
        path.write_text(content)
    for cmd in (COMPILE, VALIDATE):
        proc = run(cmd, str(path))
        assert proc.returncode == 2, proc.stderr
        (line,) = proc.stderr.decode().splitlines()
        assert str(path) in line and needle in line
        assert proc.stdout == b""


def test_unsupported_edition_is_exit_1(tmp_path: Path) -> None:
    proc = run(COMPILE, str(write(tmp_path, GOOD.replace("edition = 3", "edition = 9"))))
    assert proc.returncode == 1
    assert "supports editions 1, 2, 3, 4" in proc.stderr.decode()


def test_graph_dot_and_mermaid(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    dot = CliRunner().invoke(compile_command, [str(path), "--graph", "dot"])
    assert dot.exit_code == 0
    assert '"each" [label="each[*]\\nmap list.items", shape=box3d];' in dot.stdout
    assert '"list" -> "each" [style=bold, label="map items"];' in dot.stdout
    assert '"each" -> "join" [style=dashed, label="settled"];' in dot.stdout
    assert "shape=octagon" in dot.stdout
    mermaid = CliRunner().invoke(compile_command, [str(path), "--graph", "mermaid"])
    assert mermaid.stdout.startswith("flowchart LR\n")
    assert 't1[["each[*]<br/>map list.items"]]' in mermaid.stdout
    assert "t0 ==>|" in mermaid.stdout and "t1 -.->|settled| t2" in mermaid.stdout
    assert 't3{{"fin<br/>(agent)<br/>(epilogue)"}}' in mermaid.stdout
    bad = CliRunner().invoke(compile_command, [str(path), "--graph", "png"])
    assert bad.exit_code == 2


def test_graph_written_to_file(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    out = tmp_path / "g.dot"
    assert run(COMPILE, str(path), "--graph", "dot", "-o", str(out)).returncode == 0
    assert out.read_text().startswith('digraph "cli"')


def test_validate_ok_and_text(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    proc = run(VALIDATE, str(path))
    assert proc.returncode == 0 and proc.stdout == b""
    assert f"{path}: ok (edition 3, plan version 2, sha256:" in proc.stderr.decode()


def test_validate_json_ndjson(tmp_path: Path) -> None:
    path = write(tmp_path, BAD)
    proc = run(VALIDATE, "--json", str(path))
    assert proc.returncode == 1
    records = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert len(records) == 2  # graph rules wait until the structure is sound
    for r in records:
        assert r["file"] == str(path) and r["severity"] in ("error", "warning")
        assert isinstance(r["line"], int) and isinstance(r["col"], int)
    assert {"name-separator", "unknown-key"} <= {r["code"] for r in records}


def test_validate_plan_files(tmp_path: Path) -> None:
    plan = compile_path(write(tmp_path, GOOD)).plan
    good = tmp_path / "plan.json"
    good.write_text(json.dumps(plan))
    assert run(VALIDATE, str(good)).returncode == 0
    plan["version"] = 7
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(plan))
    proc = run(VALIDATE, "--json", str(bad))
    assert proc.returncode == 1
    (record,) = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert record["code"] == "unsupported-version" and "1, 2" in record["message"]


def test_validate_starlark_source_uses_the_manifest_edition(tmp_path: Path) -> None:
    star = tmp_path / "pack.star"
    star.write_text('workflow(name = "w", tasks = [task(name = "a", run = "x", inputs = {})])\n')
    result = CliRunner().invoke(validate_command, [str(star)])
    assert result.exit_code == 2 and "--edition" in result.stderr
    assert CliRunner().invoke(validate_command, [str(star), "--edition", "3"]).exit_code == 0
    write(tmp_path, 'edition = 2\n[workflow]\nsource = "pack.star"\n')
    result = CliRunner().invoke(validate_command, ["--json", str(star), "--edition", "3"])
    assert result.exit_code == 1
    record = json.loads(result.stdout)
    assert record["line"] == 1 and "needs edition 3" in record["message"]


def test_validate_many_files_worst_exit(tmp_path: Path) -> None:
    good = write(tmp_path, GOOD)
    bad = write(tmp_path, BAD, "bad.toml")
    assert run(VALIDATE, str(good), str(bad)).returncode == 1
    assert run(VALIDATE, str(good), str(bad), str(tmp_path / "missing.toml")).returncode == 2


def test_help_and_version_are_light() -> None:
    for cmd in ("crucible-compile", "crucible-validate"):
        proc = run(str(BIN / cmd), "--version")
        assert proc.returncode == 0 and b"0." in proc.stdout
    probe = (
        "import sys\n"
        "from crucible.compile.cli import compile_command, validate_command\n"
        "for c in (compile_command, validate_command):\n"
        "    try:\n"
        "        c.main(['--help'], standalone_mode=False)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = sorted(m for m in ('networkx', 'starlark', 'rich', 'hypothesis') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    proc = run(sys.executable, "-c", probe)
    assert proc.returncode == 0, proc.stderr
    assert b"HEAVY []" in proc.stdout
    assert b"--graph [dot|mermaid]" in proc.stdout


def test_umbrella_runs_compile(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    proc = run(str(BIN / "crucible"), "compile", "--digest", str(path))
    assert proc.returncode == 0 and proc.stdout.decode().strip() == compile_path(path).digest


def test_starlark_errors_through_the_command(tmp_path: Path) -> None:
    write(tmp_path, 'edition = 1\n[workflow]\nsource = "pack.star"\n')
    star = tmp_path / "pack.star"
    star.write_text('workflow(name = "w", tasks = [task(name = "a", run = "x", inputs = {})])\n')
    proc = run(COMPILE, str(tmp_path / "pack.toml"))
    assert proc.returncode == 1
    (line,) = proc.stderr.decode().splitlines()
    assert f"{star}:1:31:" in line and "'inputs'" in line and "[unknown-key]" in line
    star.write_text("workflow(\n")
    proc = run(COMPILE, str(tmp_path / "pack.toml"))
    assert proc.returncode == 2
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith(f"crucible-compile: error: {star}:") and "Starlark syntax" in line


def _as_nobody(argv: list[str], validate: bool) -> tuple[int, str]:
    if validate:
        return as_nobody(validate_command, "crucible-validate", argv)
    return as_nobody(compile_command, "crucible-compile", argv)


def test_directory_and_unreadable_file_are_one_line_errors(tmp_path: Path) -> None:
    # click's own path checks used to answer first, with its three-line usage block
    for cmd in (COMPILE, VALIDATE):
        proc = run(cmd, str(tmp_path))
        assert proc.returncode == 2
        (line,) = proc.stderr.decode().splitlines()
        assert str(tmp_path) in line and "is a directory" in line
    import shutil
    import tempfile

    shared = Path(tempfile.mkdtemp(prefix="compile-test-"))
    try:
        shared.chmod(0o755)
        pack = write(shared, GOOD)
        pack.chmod(0)
        for validate in (False, True):
            code, err = _as_nobody([str(pack)], validate)
            assert code == 3, err
            (line,) = err.splitlines()
            assert str(pack) in line and "Permission denied" in line
    finally:
        shutil.rmtree(shared)


@pytest.mark.parametrize("cmd", [COMPILE, VALIDATE])
def test_short_help_and_exit_codes_like_the_other_tools(cmd: str) -> None:
    # -h was a usage error here while crucible-stage/-ledger/-prove accept it
    proc = run(cmd, "-h")
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.decode().split())
    assert text.startswith(f"Usage: {Path(cmd).name} ")
    assert "Exit codes" in text and "3 I/O failure" in text


def test_empty_output_name_is_a_usage_error(tmp_path: Path) -> None:
    # -o "$(PLAN)" with PLAN unset tried to write "." (exit 3, "Device or resource busy")
    proc = run(COMPILE, str(write(tmp_path, GOOD)), "-o", "")
    assert proc.returncode == 2
    assert proc.stderr == b"crucible-compile: error: -o needs a file name (or - for stdout)\n"
