"""crucible-verify on hostile and broken command-line input (issue 12 items 20, 21, 26,
31): the documented exit code, one stderr line that names the thing, no report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from crucible.core import canon
from crucible.core.cli import run
from crucible.core.errors import EXIT_OPERATIONAL, EXIT_USAGE, OperationalError, UsageError
from crucible.proof.reader import BadExpectations, Inability, load_expectations
from crucible.proof.reader._display import escaped
from crucible.proof.reader.cli import command
from tests.proof._unprivileged import run_unprivileged, shared_tempdir
from tests.proof.reader.bundlegen import org_people, write_files

EXE = Path(sys.executable).parent / "crucible-verify"


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_files(tmp_path / "b", org_people().exported())


def verify(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(EXE), *map(str, args)], capture_output=True, check=False)


def one_line(stderr: bytes) -> str:
    assert stderr.count(b"\n") == 1 and stderr.endswith(b"\n"), stderr
    assert b"Traceback" not in stderr and b"\x1b" not in stderr and b"\r" not in stderr
    return stderr.decode()


# -- item 1: the reader's errors are CrucibleErrors with their exit codes -----------


def test_inability_and_bad_expectations_join_the_error_tree() -> None:
    assert issubclass(Inability, OperationalError) and Inability("x").exit_code == 3
    assert issubclass(BadExpectations, UsageError) and BadExpectations("x").exit_code == 2


def test_the_command_edge_translates_nothing() -> None:
    """cli.py and commands.py catch no exception: the core edge maps every error."""
    import ast

    import crucible.proof.reader.cli as cli_mod
    import crucible.proof.reader.commands as commands_mod

    for mod in (cli_mod, commands_mod):
        tree = ast.parse(Path(str(mod.__file__)).read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Try)], mod.__name__


# -- item 20: an unreadable bundle is an inability (3), not a usage error -----------


def _unprivileged_verify(argv: list[str]) -> tuple[int, str, str]:
    done = run_unprivileged(lambda: run(command, "crucible-verify", argv))
    return done.code, done.stdout, done.stderr


def test_unreadable_bundle_is_exit_3() -> None:
    with shared_tempdir() as d:
        b = write_files(d / "b", org_people().exported())
        b.chmod(0)
        code, out, err = _unprivileged_verify([str(b), "--json"])
    assert code == EXIT_OPERATIONAL, err
    assert out == ""
    assert one_line(err.encode()).startswith(f"crucible-verify: error: {b}: no verdict: ")
    assert "Permission denied" in err


def test_unreadable_file_in_bundle_is_exit_3() -> None:
    with shared_tempdir() as d:
        b = write_files(d / "b", org_people().exported())
        for dirpath, dirs, files in os.walk(b):
            for name in dirs:
                os.chmod(os.path.join(dirpath, name), 0o755)
            for name in files:
                os.chmod(os.path.join(dirpath, name), 0o644)
        (b / "execution.json").chmod(0)
        code, out, err = _unprivileged_verify([str(b)])
    assert code == EXIT_OPERATIONAL, err
    assert out == ""
    assert "execution.json" in one_line(err.encode()) and "Permission denied" in err


def test_missing_bundle_is_still_exit_3(tmp_path: Path) -> None:
    proc = verify(tmp_path / "nope")
    assert proc.returncode == 3 and proc.stdout == b""
    assert "No such file or directory" in one_line(proc.stderr)


# -- item 21: an invalid --expect file is a usage error (2), never a finding ---------


@pytest.mark.parametrize(
    "text",
    [
        '{"workflowDigest": 5}',
        '"sha256:xyz"',
        '{"epochs": "4"}',
        '{"epochs": true}',
        '{"epochs": -1}',
        '{"admissionProofDigest": "sha256:xyz"}',
        '{"rootCaseDigest": null}',
        '{"frozenDigest": "SHA256:' + "0" * 64 + '"}',
        '{"execution": 5}',
        '{"execution": "bad id"}',
        "{}",
        "[]",
        "{",
    ],
)
def test_invalid_expect_is_usage_2(tmp_path: Path, bundle: Path, text: str) -> None:
    expect = tmp_path / "expect.json"
    expect.write_text(text)
    proc = verify(bundle, "--expect", expect, "--json")
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert proc.stdout == b""
    line = one_line(proc.stderr)
    assert line.startswith(f"crucible-verify: error: {expect}: ")
    assert "finding" not in line and "digest-mismatch" not in line


def test_expect_names_the_bad_member(tmp_path: Path) -> None:
    expect = tmp_path / "e.json"
    expect.write_text('{"epochs": 4, "workflowDigest": 5}')
    with pytest.raises(BadExpectations, match="workflowDigest must be a digest"):
        load_expectations(expect)


def test_expect_that_is_a_directory_is_usage_2(tmp_path: Path, bundle: Path) -> None:
    proc = verify(bundle, "--expect", tmp_path)
    assert proc.returncode == EXIT_USAGE and proc.stdout == b""
    assert "cannot read" in one_line(proc.stderr)


def test_valid_expect_still_reads(tmp_path: Path, bundle: Path) -> None:
    expect = tmp_path / "e.json"
    expect.write_text(
        json.dumps(
            {
                "epochs": 4,
                "execution": canon.loads((bundle / "execution.json").read_bytes())["execution"],
            }
        )
    )
    assert verify(bundle, "--expect", expect).returncode == 0


# -- item 26: names with control characters stay escaped on one line ----------------


@pytest.mark.parametrize(
    "name",
    [b"a\nb", b"a\x01b", b"\x1b]0;PWNED\x07", b"\x1b[2J", b"x\ry", b"\xff\xfe", b"a\\b"],
)
def test_hostile_name_in_bundle_is_one_escaped_line(bundle: Path, name: bytes) -> None:
    aux = bundle / "aux"
    aux.mkdir()
    with open(os.path.join(os.fsencode(aux), name), "wb") as f:
        f.write(b"x")
    proc = verify(bundle, "--json")
    assert proc.returncode == 1
    report = canon.loads(proc.stdout)
    assert report["problem"]["code"] == "input-malformed"
    assert report["problem"]["path"] == "aux/" + escaped(os.fsdecode(name))
    line = one_line(proc.stderr)
    assert "not a portable file name" in line
    human = verify(bundle)
    assert human.stdout.count(b"\n") == 1 and b"\x1b" not in human.stdout
    one_line(human.stderr)


def test_escaped_is_injective_and_printable() -> None:
    names = ["a\nb", "a\\x0ab", "\udcff", "\\xff", "a\\b", "ab", "caf\u00e9", "\x9b", "\u2028"]
    shown = [escaped(n) for n in names]
    assert len(set(shown)) == len(names)
    assert all(s.isprintable() for s in shown)
    assert escaped("caf\u00e9") == "caf\u00e9" and escaped("a\nb") == "a\\x0ab"


def test_hostile_bundle_path_on_the_command_line(tmp_path: Path) -> None:
    missing = tmp_path / "no\nsuch\x1b[2J"
    proc = verify(missing)
    assert proc.returncode == 3
    assert "no\\x0asuch\\x1b[2J" in one_line(proc.stderr)


# -- item 31: a symlink to a bundle is refused as a symlink ---------------------------


def test_symlink_to_bundle_says_links_are_not_followed(tmp_path: Path, bundle: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(bundle)
    proc = verify(link, "--json")
    assert proc.returncode == EXIT_OPERATIONAL and proc.stdout == b""
    line = one_line(proc.stderr)
    assert line.startswith(f"crucible-verify: error: {link}: no verdict: ")
    assert "symbolic link" in line and "not followed" in line
    assert "Not a directory" not in line


def test_dangling_symlink_is_a_symlink_too(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    proc = verify(link)
    assert proc.returncode == EXIT_OPERATIONAL
    assert "symbolic link" in one_line(proc.stderr)
