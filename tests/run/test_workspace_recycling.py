"""A passed fan-out instance leaves (almost) nothing behind (issue 14;
docs/spec/run.md, "State directory"): its workspace goes to its task's pool
``work/<task>/@free-*`` and the next instance takes it, restaged in place; its
output file is removed once captured. Failed units, units that left anything
else in their workspace and every unit under ``--keep-workspaces`` keep theirs;
retries keep one workspace; a resume after SIGKILL reuses or ignores what the
killed run left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from crucible.run.executors._pipelined import AHEAD
from crucible.run.session._admit import worker_count
from tests.packed import keyed
from tests.run.dispatchtests import DISPATCH, Pack, dispatch, result, wait_for

N = 300
#: each instance writes its own item (as staged) and its workspace into its output
ECHO = (
    'run = \'printf "{\\"item\\": %s, \\"ws\\": \\"%s\\"}" "$(cat inputs/@values/item)" '
    '"$CRUCIBLE_WORKSPACE" > "$CRUCIBLE_OUTPUT"\'\n'
)


def fan_out(pack: Pack, n: int, run: str = ECHO, extra: str = "") -> Path:
    return pack(
        '[[workflow.task]]\nname = "items"\nemits = { items = "array" }\n'
        f"run = '''printf '{{\"items\": [' > \"$CRUCIBLE_OUTPUT\"; seq -s, 1 {n} "
        ">> \"$CRUCIBLE_OUTPUT\"; printf ']}' >> \"$CRUCIBLE_OUTPUT\"'''\n"
        '[[workflow.task]]\nname = "each"\nneeds = ["items"]\nmap = "items.items"\n'
        'emits = { item = "integer" }\n' + run + extra
    )


def pool(state: Path, task: str = "each") -> list[str]:
    return sorted(os.listdir(state / "work" / task))


def outputs(state: Path, task: str = "each") -> list[str]:
    found = []
    for attempt in (state / "output").iterdir():
        if (attempt / task).is_dir():
            found += [f"{attempt.name}/{n}" for n in os.listdir(attempt / task)]
    return sorted(found)


def test_a_no_op_fan_out_leaves_only_pool_workspaces(pack: Pack, tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = dispatch(fan_out(pack, N), "--state", state, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    left = pool(state)
    assert left and all(n.startswith("@free-") for n in left), left
    # at most what the workers held at once: each its running unit and AHEAD staged
    assert len(left) <= (AHEAD + 1) * worker_count(2), left
    assert outputs(state) == []  # no passed attempt's output file remains
    workspaces = set()
    for i in range(N):
        rec = result(state, "each", str(i))
        assert rec is not None and rec["status"] == "passed"
        assert rec["output"]["item"] == i + 1  # each saw its own item
        assert rec["output"]["ws"] == str((state / "work" / "each" / str(i)).absolute())
        workspaces.add(rec["output"]["ws"])
    assert len(workspaces) == N  # CRUCIBLE_WORKSPACE: today's path while it ran


def test_a_failing_instance_keeps_its_workspace_and_output(pack: Pack, tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = (
        "run = '''i=$(cat inputs/@values/item); printf '{\"item\": %s}' $i > \"$CRUCIBLE_OUTPUT\";"
        " [ $i != 7 ]'''\n"
    )
    proc = dispatch(fan_out(pack, 40, run), "--state", state, "-j", "2")
    assert proc.returncode == 1, proc.stderr
    rec = result(state, "each", "6")
    assert rec is not None and rec["status"] == "failed"
    kept = state / "work" / "each" / "6"
    assert (kept / "inputs" / "@values" / "item").read_bytes() == b"7"
    assert outputs(state) == ["1/6.json"]
    assert json.loads((state / "output" / "1" / "each" / "6.json").read_bytes()) == {"item": 7}
    assert [n for n in pool(state) if not n.startswith("@free-")] == ["6"]


def test_keep_workspaces_keeps_every_workspace(pack: Pack, tmp_path: Path) -> None:
    state = tmp_path / "state"
    proc = dispatch(fan_out(pack, 30), "--state", state, "-j", "2", "--keep-workspaces")
    assert proc.returncode == 0, proc.stderr
    assert pool(state) == sorted(str(i) for i in range(30))
    for i in range(30):
        ws = state / "work" / "each" / str(i)
        assert (ws / "inputs" / "@values" / "item").read_bytes() == str(i + 1).encode()
    assert outputs(state) == []  # the output files go whatever the flag


def test_keep_workspaces_on_resume_is_accepted(pack: Pack, tmp_path: Path) -> None:
    state = tmp_path / "state"
    manifest = fan_out(pack, 5)
    assert dispatch(manifest, "--state", state).returncode == 0
    proc = dispatch(manifest, "--state", state, "--resume", "--keep-workspaces")
    assert proc.returncode == 0, proc.stderr


def test_a_task_that_leaves_a_scratch_file_keeps_its_workspace(
    pack: Pack, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    run = (
        "run = '''i=$(cat inputs/@values/item); [ $((i % 5)) = 0 ] && echo s > scratch;"
        " printf '{\"item\": %s}' $i > \"$CRUCIBLE_OUTPUT\"'''\n"
    )
    proc = dispatch(fan_out(pack, 30, run), "--state", state, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    kept = [n for n in pool(state) if not n.startswith("@free-")]
    assert kept == sorted(str(i - 1) for i in range(5, 31, 5))
    for name in kept:
        assert (state / "work" / "each" / name / "scratch").read_bytes() == b"s\n"


def test_retries_keep_one_workspace(pack: Pack, tmp_path: Path) -> None:
    state = tmp_path / "state"
    marks = tmp_path / "marks"
    marks.mkdir()
    run = (
        f"run = '''echo \"$CRUCIBLE_ATTEMPT $PWD\" >> {marks}/$CRUCIBLE_KEY;"
        f" [ -e {marks}/$CRUCIBLE_KEY.once ] || {{ touch {marks}/$CRUCIBLE_KEY.once;"
        " echo '{}' > \"$CRUCIBLE_OUTPUT\"; exit 1; };"
        " printf '{\"item\": %s}' $(cat inputs/@values/item) > \"$CRUCIBLE_OUTPUT\"'''\n"
        "retries = 1\n"
    )
    proc = dispatch(fan_out(pack, 8, run), "--state", state, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    for i in range(8):
        lines = (marks / str(i)).read_text().splitlines()
        assert [ln.split()[0] for ln in lines] == ["1", "2"]
        assert lines[0].split()[1] == lines[1].split()[1]  # one workspace, both attempts
        assert result(state, "each", str(i))["output"]["item"] == i + 1  # type: ignore[index]
    assert outputs(state) == sorted(f"1/{i}.json" for i in range(8))  # failed attempts keep
    assert all(n.startswith("@free-") for n in pool(state))


def test_resume_after_sigkill_reuses_or_ignores_the_leftovers(
    pack: Pack, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    n = 120
    log = tmp_path / "ran"
    run = (
        f"run = '''sleep 0.02; echo $CRUCIBLE_KEY >> {log};"
        " printf '{\"item\": %s}' $(cat inputs/@values/item) > \"$CRUCIBLE_OUTPUT\"'''\n"
    )
    manifest = fan_out(pack, n, run)
    proc = subprocess.Popen(
        [DISPATCH, str(manifest), "--state", str(state), "-j", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(lambda: len(keyed(state, "each")) >= 30, timeout=60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # what a kill can leave: a pool entry with a stale tree, a workspace half staged
    stale = state / "work" / "each" / "@free-999999-1" / "inputs" / "@values"
    stale.mkdir(parents=True)
    (stale / "item").write_bytes(b"999")
    (stale / "junk").mkdir()
    settled = set(keyed(state, "each"))
    todo = sorted(str(i) for i in range(n) if str(i) not in settled)
    assert todo
    half = state / "work" / "each" / todo[0]
    (half / "@tmp-inputs-x").mkdir(parents=True, exist_ok=True)

    def resumed() -> subprocess.CompletedProcess[str]:
        return dispatch(manifest, "--state", state, "--resume", "-j", "2")

    deadline = time.monotonic() + 30
    while True:  # the killed run's workers let go of the lock once their tasks are dead
        done = resumed()
        if "another dispatcher" not in done.stderr or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert done.returncode == 0, done.stderr
    for i in range(n):
        rec = result(state, "each", str(i))
        assert rec is not None and rec["status"] == "passed", i
        assert rec["output"]["item"] == i + 1
    assert sorted(keyed(state, "each"), key=int) == [str(i) for i in range(n)]
    assert not (state / "results" / "each").exists()  # packed: results/each.jsonl
    # an attempt killed between its record and the removal of its output keeps it
    assert len(outputs(state)) <= (AHEAD + 1) * worker_count(2)  # the units the workers held


def test_edition_1_fan_out_recycles_and_sees_its_items(tmp_path: Path) -> None:
    root = tmp_path / "pack"
    root.mkdir()
    manifest = root / "pack.toml"
    manifest.write_text(
        '[workflow]\nname = "v1"\n'
        '[[workflow.task]]\nname = "items"\nemits = { items = "array" }\n'
        "run = '''printf '{\"items\": [10, 11, 12, 13, 14, 15, 16, 17]}' > \"$CRUCIBLE_OUTPUT\"'''\n"
        '[[workflow.task]]\nname = "each"\nneeds = ["items"]\nmap = "items.items"\n'
        'emits = { item = "integer" }\n'
        "run = ['python3', '-c', 'import json,os; i=json.load(open(os.environ[\"CRUCIBLE_INPUTS_FILE\"]));"
        " json.dump({\"item\": i[\"item\"]}, open(os.environ[\"CRUCIBLE_OUTPUT\"], \"w\"))']\n"
    )
    state = tmp_path / "state"
    proc = dispatch(manifest, "--state", state, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    for i in range(8):
        assert result(state, "each", str(i))["output"]["item"] == 10 + i  # type: ignore[index]
    assert all(n.startswith("@free-") for n in pool(state))


def test_an_ancestor_with_50_files_keeps_its_links_across_recycled_instances(
    pack: Pack, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    manifest = pack(
        '[[workflow.task]]\nname = "items"\nemits = { items = "array" }\n'
        'emits_files = ["out/**"]\n'
        "run = '''mkdir out; for i in $(seq -w 1 50); do echo file $i > out/f$i; done;"
        " printf '{\"items\": [' > \"$CRUCIBLE_OUTPUT\"; seq -s, 1 40 >> \"$CRUCIBLE_OUTPUT\";"
        " printf ']}' >> \"$CRUCIBLE_OUTPUT\"'''\n"
        '[[workflow.task]]\nname = "each"\nneeds = ["items"]\nmap = "items.items"\n'
        'emits = { ino = "integer", sum = "string" }\n'
        "run = '''printf '{\"ino\": %s, \"sum\": \"%s\"}' $(stat -c %i inputs/items/out/f07)"
        " \"$(cat inputs/items/out/* | md5sum | cut -c1-32)\" > \"$CRUCIBLE_OUTPUT\"'''\n"
    )
    proc = dispatch(manifest, "--state", state, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    # dispatch publishes the store itself (one copy; inputs.md 3.4): views link it
    published = state / "files" / "items" / "out" / "f07"
    if published.stat().st_nlink == 1:
        pytest.skip("reflinked or copied: no shared inode to keep")
    expected = subprocess.run(
        "cat " + " ".join(str(published.parent / f"f{i:02}") for i in range(1, 51)) + " | md5sum",
        shell=True,
        capture_output=True,
        text=True,
        check=True,
    ).stdout[:32]
    inodes = set()
    for i in range(40):
        out = result(state, "each", str(i))["output"]  # type: ignore[index]
        assert out["sum"] == expected
        inodes.add(out["ino"])
    assert inodes == {published.stat().st_ino}  # every instance held the published inode
    # links: the published copy, plus one per pool workspace (not one per instance)
    assert published.stat().st_nlink == 1 + len(pool(state))


def test_two_pools_never_take_the_same_free_workspace(tmp_path: Path) -> None:
    """Two worker processes (two pools over one task directory): a free
    workspace is taken by a rename, so only one of them gets it."""
    from crucible.run.executors._recycle import WorkspacePool

    task_dir = tmp_path / "work" / "t"
    (task_dir / "a" / "inputs").mkdir(parents=True)
    first, second = WorkspacePool(keep=False), WorkspacePool(keep=False)
    assert first.release("a", task_dir / "a")
    (freed,) = os.listdir(task_dir)
    assert freed.startswith("@free-")
    got = [second.acquire("b", task_dir / "b"), first.acquire("c", task_dir / "c")]
    assert got == [True, False]
    assert sorted(os.listdir(task_dir)) == ["b"] and (task_dir / "b" / "inputs").is_dir()
    # an unkeyed unit, a kept pool, an existing workspace: nothing taken or given
    assert not first.release(None, task_dir / "b")
    assert not WorkspacePool(keep=True).release("b", task_dir / "b")
    (task_dir / "d").mkdir()
    assert second.release("b", task_dir / "b")
    assert not second.acquire("d", task_dir / "d")


@pytest.mark.parametrize(
    "entries", [["inputs", "scratch"], ["other"], ["inputs-as-file"], ["inputs-as-symlink"]]
)
def test_only_a_workspace_holding_just_its_inputs_is_recyclable(
    tmp_path: Path, entries: list[str]
) -> None:
    from crucible.run.executors._recycle import recyclable

    ws = tmp_path / "ws"
    ws.mkdir()
    assert recyclable(ws)
    for name in entries:
        if name == "inputs-as-file":
            (ws / "inputs").write_bytes(b"")
        elif name == "inputs-as-symlink":
            (ws / "inputs").symlink_to(tmp_path)
        elif name == "inputs":
            (ws / "inputs").mkdir()
        else:
            (ws / name).write_bytes(b"x")
    assert not recyclable(ws)


def test_hostile_instances_leave_the_next_one_its_own_item(pack: Pack, tmp_path: Path) -> None:
    """Each instance reads its item, then vandalises it (by its item mod 5: a
    symlink out, a FIFO, a directory, a hard link to the store's file, a chmod
    and a write) and passes: its workspace is recycled, and every next instance
    still reads its own item; nothing outside or in the store changes."""
    state = tmp_path / "state"
    outside = tmp_path / "outside"
    outside.write_bytes(b"outside")
    n = 40
    run = (
        "run = '''i=$(cat inputs/@values/item); v=inputs/@values/item;"
        " printf '{\"item\": %s}' $i > \"$CRUCIBLE_OUTPUT\";"
        " case $((i % 5)) in"
        f" 0) rm -f $v; ln -s {outside} $v;;"
        " 1) rm -f $v; mkfifo $v;;"
        " 2) rm -f $v; mkdir $v; echo x > $v/x;;"
        " 3) rm -f $v; ln \"$(ls -d $CRUCIBLE_WORKSPACE/../../../files/items/out/f1)\" $v;;"
        " 4) chmod 644 $v; echo 999 > $v;;"
        " esac'''\n"
    )
    manifest = pack(
        '[[workflow.task]]\nname = "items"\nemits = { items = "array" }\n'
        'emits_files = ["out/**"]\n'
        "run = '''mkdir out; echo store > out/f1;"
        f" printf '{{\"items\": [' > \"$CRUCIBLE_OUTPUT\"; seq -s, 1 {n} >> \"$CRUCIBLE_OUTPUT\";"
        " printf ']}' >> \"$CRUCIBLE_OUTPUT\"'''\n"
        '[[workflow.task]]\nname = "each"\nneeds = ["items"]\nmap = "items.items"\n'
        'emits = { item = "integer" }\n' + run + "timeout = 20\n"
    )
    proc = dispatch(manifest, "--state", state, "-j", "2")
    assert proc.returncode == 0, proc.stderr
    for i in range(n):
        assert result(state, "each", str(i))["output"]["item"] == i + 1  # type: ignore[index]
    assert outside.read_bytes() == b"outside"
    assert (state / "files" / "items" / "out" / "f1").read_bytes() == b"store\n"
    assert not (state / "shared" / "items" / "tree").exists()  # the store is the published copy
    assert all(n.startswith("@free-") for n in pool(state))
