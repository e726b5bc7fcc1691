"""crucible-prove on hostile targets and a full disk (issue 12 items 6 and 28): only a
bundle is ever replaced, and a failed write is exit 3 naming the file."""

from __future__ import annotations

import ast
import os
import resource
import signal
import subprocess
from pathlib import Path

import pytest

from crucible.core.errors import CrucibleError, OperationalError, UsageError
from crucible.proof import layout
from crucible.proof.writer import Unrecordable
from tests.proof.writer.prove_helpers import PROVE, Scenario, org_people, prove_args, read_tree


def argv(s: Scenario, out: Path) -> list[str]:
    return [str(PROVE), *prove_args(s, out)]


def one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    return stderr


# -- item 6: only a directory whose inventory is a bundle may be replaced ------------


def test_dir_holding_a_proof_among_other_files_is_not_replaced(tmp_path: Path) -> None:
    s = org_people(tmp_path / "s")
    p = tmp_path / "p"
    (p / "src").mkdir(parents=True)
    (p / "src" / "main.c").write_text("int main;")
    (p / layout.ADMISSION_PROOF).write_text("{}")
    before = read_tree(p)
    proc = subprocess.run(argv(s, p), capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    line = one_line(proc.stderr)
    assert "is not a bundle" in line and "src/main.c" in line
    assert read_tree(p) == before
    assert not list(tmp_path.glob(".p.*"))


def _bundle(tmp_path: Path) -> Path:
    s = org_people(tmp_path / "s")
    s.prove(tmp_path / "b")
    return tmp_path / "b"


def test_previous_bundle_is_replaced(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    s = org_people(tmp_path / "again")
    proc = subprocess.run(argv(s, b), capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


def test_empty_dir_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    org_people(tmp_path / "s").prove(tmp_path / "empty")
    assert (tmp_path / "empty" / layout.WORKFLOW).is_file()


@pytest.mark.parametrize(
    ("damage", "says"),
    [
        (lambda b: (b / "notes.txt").write_text("mine"), "'notes.txt' is no bundle path"),
        (
            lambda b: (b / "aux").mkdir() or (b / "aux" / "x").symlink_to("/etc/passwd"),
            "'aux/x' is not a regular file",
        ),
        (lambda b: os.mkfifo(b / "README.md"), "'README.md' is not a regular file"),
        (lambda b: (b / layout.WORKFLOW).unlink(), "no workflow.json"),
        (lambda b: (b / "src").mkdir(), "'src' is an empty directory"),
        (
            lambda b: (b / "instances" / "r" / "attempts" / "1" / "x.json").write_text("1"),
            "no bundle path",
        ),
    ],
)
def test_bundle_with_foreign_content_is_not_replaced(
    tmp_path: Path, damage: object, says: str
) -> None:
    b = _bundle(tmp_path)
    damage(b)  # type: ignore[operator]
    before = sorted(p.name for p in b.rglob("*"))
    with pytest.raises(UsageError, match="is not a bundle") as info:
        org_people(tmp_path / "again").prove(b)
    assert says in str(info.value)
    assert sorted(p.name for p in b.rglob("*")) == before


def test_symlink_out_is_not_replaced(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(b)
    with pytest.raises(UsageError, match="symbolic link"):
        org_people(tmp_path / "again").prove(link)
    assert link.is_symlink()


def test_bundle_paths_are_the_closed_path_table() -> None:
    good = [
        "workflow.json",
        "frozen/org.json",
        "sets/people.json",
        "selections/org/12.json",
        "instances/r/case.json",
        "instances/a.b-c/attempts/3/audit.sig",
        "outputs/org/r/1/0.payload.json",
        "outputs/org/r/1/10.envelope.json",
        "aux/notes/x.txt",
        "partial.json",
    ]
    bad = [
        "src/a.c",
        "aux/",
        "selections/org/01.json",
        "frozen/Org.json",
        "x/workflow.json",
        "outputs/org/r/0/0.payload.json",
        "instances/r/attempts/1/extra.json",
        "workflow.json/",
    ]
    assert all(layout.is_bundle_path(p) for p in good)
    assert not any(layout.is_bundle_path(p) for p in bad)


# -- item 28: a full disk (here a file-size limit) names the file ----------------------


def _small_files_only() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write(2) fails with EFBIG instead
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (400, hard))


def test_failed_write_is_exit_3_naming_the_file(tmp_path: Path) -> None:
    b = _bundle(tmp_path)
    before = read_tree(b)
    s = org_people(tmp_path / "again")
    cmd = argv(s, b)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, check=False, preexec_fn=_small_files_only
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == ""
    line = one_line(proc.stderr)
    assert line.startswith(f"crucible-prove: error: {b}: cannot write ")
    named = line.split("cannot write ", 1)[1].split(":", 1)[0]
    assert layout.is_bundle_path(named), line
    assert "File too large" in line and "previous bundle is untouched" in line
    assert read_tree(b) == before
    assert not list(tmp_path.glob(".b.*"))


# -- issue 11 item 1: the writer's errors are in the tree, the edge translates nothing --


def test_unrecordable_is_an_operational_error() -> None:
    assert issubclass(Unrecordable, OperationalError)
    assert Unrecordable("x", 3).exit_code == 3 and Unrecordable("x", 3).line == 3
    assert issubclass(UsageError, CrucibleError)


def test_the_command_edge_translates_nothing() -> None:
    import crucible.proof.writer.cli as cli_mod
    import crucible.proof.writer.commands as commands_mod

    for mod in (cli_mod, commands_mod):
        tree = ast.parse(Path(str(mod.__file__)).read_text())
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Try)], mod.__name__
