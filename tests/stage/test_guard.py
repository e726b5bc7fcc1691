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


def test_a_second_write_after_a_restore_is_caught_too(tmp_path: Path) -> None:
    """The restored store file is a new inode: the published set is built again
    (a new generation naming it), so the next consumer's write through it is
    caught and undone like the first. Before: the manifest kept naming the
    first inode, the second write went unseen and stayed in the store."""
    out = _child(
        tmp_path,
        """
        os.unlink(ws / "twice-elsewhere")
        sd.capture("p", ws, output_file=ws / "none", exit_code=0, empty_workspace=True)
        guard_views()
        store = state / "files" / "p" / "out" / "f"
        for name in ("a", "b"):
            w = state / "work" / name
            sd.stage_inputs(name, w)
            view = w / "inputs" / "p" / "out" / "f"
            assert os.lstat(view).st_ino == os.lstat(store).st_ino, name
            subprocess.run(["sh", "-c", f"chmod u+w {view} && echo {name} > {view}"], check=True)
            notes = sd.check_inputs(name, w)
            assert notes and f"changed while {name} held it" in notes[0], (name, notes)
            assert store.read_bytes() == b"captured" * 1000, name
        c = state / "work" / "c"
        sd.stage_inputs("a", c)
        assert (c / "inputs" / "p" / "out" / "f").read_bytes() == b"captured" * 1000
        assert sd.check_inputs("a", c) == []
        print("ok")
        """,
    )
    assert out.strip() == "ok"


def test_a_write_under_way_while_the_next_consumer_is_staged_is_never_copied(
    tmp_path: Path,
) -> None:
    """The interleaving a dispatch worker meets when it stages the next unit
    while the running one writes its view: the staging checked the published
    files, then the lease broke (its bytes saved) and the writer holds the
    inode open with other bytes in it, so no lease can be taken for the next
    consumer and it gets a copy. That copy must be of the captured bytes:
    the store is restored first, and the writer is named at its check."""
    out = _child(
        tmp_path,
        """
        import time
        from crucible.stage import _guard
        os.unlink(ws / "twice-elsewhere")
        sd.capture("p", ws, output_file=ws / "none", exit_code=0, empty_workspace=True)
        guard_views()
        store = state / "files" / "p" / "out" / "f"
        a = state / "work" / "a"
        sd.stage_inputs("a", a)
        view = a / "inputs" / "p" / "out" / "f"
        writer = []
        real = _guard.lease

        def lease(path, holder, backups):
            if holder.endswith("/b") and not writer:  # after b's check of the published set
                code = (
                    "import os, sys; os.chmod(sys.argv[1], 0o644); "
                    "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC); os.write(fd, b'EVIL'); "
                    "print('written', flush=True); sys.stdin.read()"
                )
                w = subprocess.Popen(
                    [sys.executable, "-c", code, str(view)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                )
                writer.append(w)
                assert w.stdout.readline() == b"written\\n"  # a's lease broke meanwhile
            return real(path, holder, backups)

        _guard.lease = lease
        b = state / "work" / "b"
        sd.stage_inputs("b", b)
        assert writer, "the writer never ran"
        assert (b / "inputs" / "p" / "out" / "f").read_bytes() == b"captured" * 1000
        assert store.read_bytes() == b"captured" * 1000
        writer[0].stdin.close()
        writer[0].wait()
        notes = sd.check_inputs("a", a)
        assert notes and "changed while a held it" in notes[0], notes
        assert sd.check_inputs("b", b) == []
        assert store.read_bytes() == b"captured" * 1000
        print("ok")
        """,
    )
    assert out.strip() == "ok"


def test_an_inode_already_restored_is_relinked_and_no_innocent_consumer_is_named(
    tmp_path: Path,
) -> None:
    """b was staged ahead holding the inode a then wrote; a's check restored
    the store (a new inode, which c was then handed). b's refresh before it
    starts relinks b to that inode: it does not restore it again, so c, who
    holds it and wrote nothing, is not named at its check."""
    out = _child(
        tmp_path,
        """
        os.unlink(ws / "twice-elsewhere")
        sd.capture("p", ws, output_file=ws / "none", exit_code=0, empty_workspace=True)
        guard_views()
        store = state / "files" / "p" / "out" / "f"
        a, b, c = (state / "work" / n for n in ("a", "b", "c"))
        sd.stage_inputs("a", a)
        sd.stage_inputs("b", b)  # ahead: the same inode as a
        view = a / "inputs" / "p" / "out" / "f"
        subprocess.run(["sh", "-c", f"chmod u+w {view} && echo EVIL > {view}"], check=True)
        assert sd.check_inputs("a", a)
        restored = os.lstat(store).st_ino
        sd.stage_inputs("a", c)  # c: a consumer of p staged after the restore
        assert os.lstat(c / "inputs" / "p" / "out" / "f").st_ino == restored
        assert sd.refresh_inputs("b", b) == ["inputs/p/out/f"]
        assert (b / "inputs" / "p" / "out" / "f").read_bytes() == b"captured" * 1000
        assert os.lstat(store).st_ino == restored  # not restored a second time
        assert sd.check_inputs("a", c) == []
        assert sd.check_inputs("b", b) == []
        print("ok")
        """,
    )
    assert out.strip() == "ok"
