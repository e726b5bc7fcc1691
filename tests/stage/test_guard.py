"""One copy at the stage level (docs/spec/inputs.md 3.4 and 4, "One copy"):
capture by link only when safe, views that link the stored inode only under a
read lease, a write through a view saved first and the store restored.

Each scenario runs in a child process: :func:`crucible.stage.guard_views` is
process-wide (it is a dispatch worker's), and the other stage tests use copy mode."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PRELUDE = """
import hashlib, os, subprocess, sys
from pathlib import Path
from crucible.stage import StateDir, guard_views
from tests.stage.stageplans import plan, task

state = Path(sys.argv[1])
p = plan(task("p", emits_files=["out"]), task("a", needs=["p"]), task("b", needs=["p"]), version=2)
sd = StateDir(p, state)
ws = state / "work" / "p"
(ws / "out").mkdir(parents=True)
(ws / "out" / "f").write_bytes(b"captured" * 1000)
(ws / "out" / "twice").write_bytes(b"two names")
os.link(ws / "out" / "twice", ws / "twice-elsewhere")
(ws / "none").write_bytes(b"{}")
"""


def _child(tmp_path: Path, body: str) -> str:
    script = tmp_path / "child.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    state = tmp_path / "state"
    repo = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": repo}
    done = subprocess.run(
        [sys.executable, str(script), str(state)],
        capture_output=True, text=True, timeout=120, cwd=repo, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_capture_by_link_empties_only_what_it_may(tmp_path: Path) -> None:
    out = _child(
        tmp_path,
        """
        before = os.lstat(ws / "out" / "f").st_ino
        rec = sd.capture("p", ws, output_file=ws / "none", exit_code=0, empty_workspace=True)
        assert rec["status"] == "passed", rec["note"]
        store = state / "files" / "p" / "out"
        assert os.lstat(store / "f").st_ino == before  # moved: no byte copied
        assert not (ws / "out" / "f").exists()
        # a file with another name is copied, and both its names stay
        assert (ws / "out" / "twice").exists() and (ws / "twice-elsewhere").exists()
        assert os.lstat(store / "twice").st_ino != os.lstat(ws / "out" / "twice").st_ino
        digests = {f["path"]: f["digest"] for f in rec["files"]}
        assert digests["out/f"] == "sha256:" + hashlib.sha256(b"captured" * 1000).hexdigest()
        print("ok")
        """,
    )
    assert out.strip() == "ok"


def test_a_file_held_open_for_writing_is_copied_not_moved(tmp_path: Path) -> None:
    out = _child(
        tmp_path,
        """
        os.unlink(ws / "twice-elsewhere")
        writer = os.open(ws / "out" / "f", os.O_WRONLY)  # a leftover process's descriptor
        rec = sd.capture("p", ws, output_file=ws / "none", exit_code=0, empty_workspace=True)
        assert rec["status"] == "passed", rec["note"]
        store = state / "files" / "p" / "out"
        assert os.lstat(store / "f").st_ino != os.fstat(writer).st_ino
        assert (ws / "out" / "f").exists()  # not moved: the workspace keeps it
        assert not (ws / "out" / "twice").exists()  # this one had one name: moved
        print("ok")
        """,
    )
    assert out.strip() == "ok"


def test_a_write_through_a_leased_view_is_caught_and_the_store_restored(tmp_path: Path) -> None:
    out = _child(
        tmp_path,
        """
        os.unlink(ws / "twice-elsewhere")
        rec = sd.capture("p", ws, output_file=ws / "none", exit_code=0, empty_workspace=True)
        guard_views()
        a = state / "work" / "a"
        sd.stage_inputs("a", a)
        view = a / "inputs" / "p" / "out" / "f"
        store = state / "files" / "p" / "out" / "f"
        assert os.lstat(view).st_ino == os.lstat(store).st_ino  # the one copy
        # a consumer (another process, as root may) chmods and writes its view
        subprocess.run(["sh", "-c", f"chmod u+w {view} && echo tampered > {view}"], check=True)
        assert view.read_bytes() == b"tampered\\n"
        notes = sd.check_inputs("a", a)
        assert notes and "inputs/p/out/f" in notes[0] and "changed while a held it" in notes[0]
        assert store.read_bytes() == b"captured" * 1000  # restored from the saved bytes
        assert os.lstat(store).st_ino != os.lstat(view).st_ino
        assert os.listdir(state / "shared" / "@backup") == []
        b = state / "work" / "b"
        sd.stage_inputs("b", b)
        assert (b / "inputs" / "p" / "out" / "f").read_bytes() == b"captured" * 1000
        assert sd.check_inputs("b", b) == []
        print("ok")
        """,
    )
    assert out.strip() == "ok"


def test_no_lease_no_link(tmp_path: Path) -> None:
    """A stored inode someone holds open for writing cannot be leased: the
    consumer gets a copy, never an unguarded link."""
    out = _child(
        tmp_path,
        """
        os.unlink(ws / "twice-elsewhere")
        sd.capture("p", ws, output_file=ws / "none", exit_code=0, empty_workspace=True)
        guard_views()
        store = state / "files" / "p" / "out" / "f"
        writer = os.open(store, os.O_WRONLY)
        a = state / "work" / "a"
        sd.stage_inputs("a", a)
        assert os.lstat(a / "inputs" / "p" / "out" / "f").st_ino != os.lstat(store).st_ino
        os.close(writer)
        print("ok")
        """,
    )
    assert out.strip() == "ok"


@pytest.mark.parametrize("guarded", [False])
def test_without_the_guard_views_never_link_the_store(tmp_path: Path, guarded: bool) -> None:
    out = _child(
        tmp_path,
        """
        os.unlink(ws / "twice-elsewhere")
        sd.capture("p", ws, output_file=ws / "none", exit_code=0, empty_workspace=True)
        a = state / "work" / "a"
        sd.stage_inputs("a", a)
        store = state / "files" / "p" / "out" / "f"
        assert os.lstat(a / "inputs" / "p" / "out" / "f").st_ino != os.lstat(store).st_ino
        assert (state / "shared" / "p" / "tree" / "out" / "f").exists()  # copy mode
        print("ok")
        """,
    )
    assert out.strip() == "ok"
