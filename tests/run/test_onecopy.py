"""One copy of bulk bytes (issue 33 item 1; docs/spec/inputs.md 3.4 and 4,
"One copy"): a passed producer's files move into the store by hard link, its
workspace is emptied of them, and its consumers' views are links to the one
stored inode, guarded by read leases: a consumer that chmods and writes its
view is caught and the store keeps the captured bytes."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.run.dispatchtests import dispatch, result

FILES = 50
SIZE = 100_000
FANOUT = 50

PACK = """edition = 4

[workflow]
name = "onecopy"

[[workflow.task]]
name = "split"
emits_files = ["chunks"]
run = '''mkdir chunks && i=0 && while [ $i -lt {files} ]; do head -c {size} /dev/urandom > chunks/c$i; i=$((i+1)); done && printf '{{}}' > "$CRUCIBLE_OUTPUT"'''

[[workflow.task]]
name = "use"
needs = ["split"]
map = {{ count = {fanout} }}
run = '''{consumer}'''
"""

READ = """printf '{"n": %s}' "$(cat inputs/split/chunks/* | wc -c)" > "$CRUCIBLE_OUTPUT\""""


def _allocated(state: Path, *, dirs: bool) -> int:
    """Bytes of blocks allocated under ``state``, each inode counted once
    (regular files only, or directories too)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for top, subdirs, files in os.walk(state):
        for name in files + (subdirs if dirs else []):
            st = os.lstat(os.path.join(top, name))
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
    return total


def _run(tmp_path: Path, consumer: str, *extra: str) -> tuple[Path, int]:
    pack = tmp_path / "pack.toml"
    pack.write_text(PACK.format(files=FILES, size=SIZE, fanout=FANOUT, consumer=consumer))
    state = tmp_path / "st"
    r = dispatch(pack, "--state", state, "-j", "2", *extra)
    return state, r.returncode


def test_a_passed_fan_out_leaves_each_captured_byte_once(tmp_path: Path) -> None:
    state, code = _run(tmp_path, READ)
    assert code == 0
    captured = FILES * SIZE
    # the producer's workspace holds nothing of what was captured
    assert not (state / "work" / "split" / "chunks").exists()
    store = state / "files" / "split" / "chunks"
    assert len(os.listdir(store)) == FILES
    # no published copy beside the store: views link the stored inodes
    assert not (state / "shared" / "split" / "tree").exists()
    rec = result(state, "use", "7")
    assert rec is not None and rec["output"] == {"n": captured}
    # every file's blocks (records, log, the store), each inode once
    assert _allocated(state, dirs=False) <= 1.1 * captured, _allocated(state, dirs=False) / captured
    # directories too: the consumers' view trees cost a few blocks each
    assert _allocated(state, dirs=True) <= 1.15 * captured, _allocated(state, dirs=True) / captured


def test_keep_workspaces_keeps_the_producer_whole(tmp_path: Path) -> None:
    state, code = _run(tmp_path, READ, "--keep-workspaces")
    assert code == 0
    assert len(os.listdir(state / "work" / "split" / "chunks")) == FILES


WRITER = """if [ "$CRUCIBLE_KEY" = 3 ]; then chmod u+w inputs/split/chunks/c0 && echo tampered > inputs/split/chunks/c0; fi; printf '{}' > "$CRUCIBLE_OUTPUT\""""


def test_a_consumer_writing_its_view_is_caught_and_the_store_is_intact(tmp_path: Path) -> None:
    state, code = _run(tmp_path, WRITER)
    assert code == 1
    rec = result(state, "split")
    assert rec is not None
    want = {f["path"]: f["digest"] for f in rec["files"]}
    for rel, digest in want.items():
        data = (state / "files" / "split" / rel).read_bytes()
        assert "sha256:" + hashlib.sha256(data).hexdigest() == digest, rel
    bad = result(state, "use", "3")
    assert bad is not None and bad["status"] == "failed"
    assert "inputs/split/chunks/c0" in bad["note"]
    assert "changed while" in bad["note"]
    others = [result(state, "use", str(k)) for k in range(FANOUT) if k != 3]
    assert all(r is not None for r in others)


@pytest.mark.parametrize("files", [1])
def test_a_file_with_another_name_is_copied_not_moved(tmp_path: Path, files: int) -> None:
    """A file the task also linked elsewhere keeps its workspace name: the
    store gets a copy (a later write through the other name must not reach it)."""
    pack = tmp_path / "pack.toml"
    pack.write_text(
        'edition = 3\n[workflow]\nname = "x"\n[[workflow.task]]\nname = "p"\n'
        'emits_files = ["out"]\n'
        "run = '''echo hi > out && ln out other && printf '{}' > \"$CRUCIBLE_OUTPUT\"'''\n"
    )
    state = tmp_path / "st"
    r = dispatch(pack, "--state", state)
    assert r.returncode == 0, r.stderr
    ws_out = state / "work" / "p" / "out"
    stored = state / "files" / "p" / "out"
    assert ws_out.exists() and stored.read_text() == "hi\n"
    assert os.lstat(ws_out).st_ino != os.lstat(stored).st_ino
