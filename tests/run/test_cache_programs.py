"""PATH is keyed as the programs a task names (docs/spec/cache.md, "PATH: the
programs, not the string"): which words are programs, and what changes the key."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.core import canon, digest
from crucible.core.plan import Task
from crucible.run.cache._programs import command_words, program_components


def _digest(value: object) -> str:
    return digest.of_bytes(canon.dumps(value))


@pytest.mark.parametrize(
    ("run", "words"),
    [
        ("python3 tok.py", ["sh", "python3"]),
        ('X=1 python3 -c "print(1)" | sort -u > out', ["sh", "python3", "sort"]),
        (
            "cd sub && make -j2; echo $(date) `whoami`",
            ["sh", "cd", "make", "echo", "date", "whoami"],
        ),
        ("if test -f x; then cat x; fi", ["sh", "test", "cat"]),
        ('"$TOOL" --flag', ["sh"]),  # an expansion: resolved only at run time
        ("/usr/bin/env python3 x.py", ["sh", "/usr/bin/env"]),
        ("echo 'unbalanced", ["sh"]),
        (["python3", "-c", "pass"], ["python3"]),
    ],
)
def test_the_programs_a_command_line_names(run: str | list[str], words: list[str]) -> None:
    assert command_words(run) == words
    # the model's argv is a tuple: the same words, and the same for the task
    argv = run if isinstance(run, str) else tuple(run)
    assert command_words(argv) == words
    task = Task(name="t", kind="command", run=argv)
    assert set(program_components(task, {"PATH": ""}, _digest)) == {f"program:{w}" for w in words}


def _exe(directory: Path, name: str, body: str = "#!/bin/sh\n") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(body)
    path.chmod(0o755)
    return path


def test_a_path_entry_holding_none_of_them_changes_nothing(tmp_path: Path) -> None:
    base = tmp_path / "base"
    _exe(base, "tool")
    _exe(base, "sh")
    task = Task(name="t", kind="command", run="tool --go")
    before = program_components(task, {"PATH": str(base)}, _digest)
    _exe(tmp_path / "venv", "unrelated")
    after = program_components(task, {"PATH": f"{tmp_path / 'venv'}:{base}"}, _digest)
    assert set(before) == {"program:sh", "program:tool"}
    assert before == after


def test_another_program_first_on_path_or_an_edited_one_changes_the_key(tmp_path: Path) -> None:
    base = tmp_path / "base"
    tool = _exe(base, "tool")
    task = Task(name="t", kind="command", run="tool --go")
    before = program_components(task, {"PATH": str(base)}, _digest)
    _exe(tmp_path / "venv", "tool", "#!/bin/sh\necho other\n")
    shadowed = program_components(task, {"PATH": f"{tmp_path / 'venv'}:{base}"}, _digest)
    assert shadowed["program:tool"] != before["program:tool"]
    assert shadowed["program:sh"] == before["program:sh"]
    tool.write_text("#!/bin/sh\necho edited\n")
    os.utime(tool, ns=(1, 1))  # same size class, another mtime: read again
    assert program_components(task, {"PATH": str(base)}, _digest) != before


def test_a_program_changed_since_a_given_time_counts_as_changed(tmp_path: Path) -> None:
    base = tmp_path / "base"
    _exe(base, "tool")
    task = Task(name="t", kind="command", run="tool")
    now = program_components(task, {"PATH": str(base)}, _digest)
    earlier = program_components(task, {"PATH": str(base)}, _digest, changed_after=0)
    assert earlier["program:tool"] != now["program:tool"]
    later = program_components(task, {"PATH": str(base)}, _digest, changed_after=2**62)
    assert later == now
