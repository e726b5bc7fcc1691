"""The dispatcher's per-task CPU (issue 14, item 2): what staging and capture
stopped doing per unit keeps every answer it gave.

- params.json is parsed once per process while its identity holds, and read
  again when it changes; a caller never shares the cached object;
- a plain record is written under a pid-and-counter temp name: a stale one of
  that name is skipped, a missing results directory is made, nothing is left;
- staging says which producer units a consumer holds (what the worker's
  refresh and check are given instead of looking again), the same units
  ``held_units`` finds.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crucible.core import canon
from crucible.stage import StateDir, _store
from crucible.stage._inputs import held_units, load_params
from tests.stage.stageplans import plan, settle, task


@pytest.fixture
def state(tmp_path: Path) -> Path:
    s = tmp_path / "state"
    s.mkdir()
    return s


def test_params_are_read_again_when_the_file_changes(state: Path) -> None:
    p = plan(task("a"), version=2, params={"n": {"type": "integer", "default": 1}})
    pv = StateDir(p, state).view
    (state / "params.json").write_bytes(canon.dumps({"n": 1, "deep": {"x": [1]}}))
    first = load_params(pv, state)
    assert first == {"n": 1, "deep": {"x": [1]}}
    first["deep"]["x"].append(2)  # the caller's own copy
    assert load_params(pv, state) == {"n": 1, "deep": {"x": [1]}}
    # replaced (a new inode, as an atomic write makes): read again
    tmp = state / "params.tmp"
    tmp.write_bytes(canon.dumps({"n": 2}))
    os.replace(tmp, state / "params.json")
    assert load_params(pv, state) == {"n": 2}
    # rewritten in place with another size: read again
    (state / "params.json").write_bytes(canon.dumps({"n": 33}))
    assert load_params(pv, state) == {"n": 33}
    os.unlink(state / "params.json")  # gone: the plan's defaults
    assert load_params(pv, state) == {"n": 1}


def test_a_plain_record_skips_a_stale_temp_name_and_leaves_none(state: Path) -> None:
    results = state / "results"  # not there yet: made at the first record
    record = {"format": _store.RESULT_FORMAT, "task": "a", "status": "passed", "note": ""}
    _store.store_record(state, record, durable=False)
    assert canon.loads((results / "a.json").read_bytes()) == record
    # the next temp name this process would use, left behind by a crash
    stale = results / f"@tmp-r{os.getpid()}-{_store._tmp_seq[0] + 1}"
    stale.write_bytes(b"left over")
    record2 = {**record, "note": "again"}
    _store.store_record(state, record2, durable=True)
    assert canon.loads((results / "a.json").read_bytes()) == record2
    assert stale.read_bytes() == b"left over"  # not ours: untouched
    assert sorted(p.name for p in results.iterdir()) == sorted(["a.json", stale.name])
    assert oct((results / "a.json").stat().st_mode & 0o777) == oct(0o644)


def test_a_plain_record_over_a_directory_fails_as_an_operational_error(state: Path) -> None:
    from crucible.core.errors import OperationalError

    (state / "results" / "a.json").mkdir(parents=True)
    record = {"format": _store.RESULT_FORMAT, "task": "a", "status": "passed", "note": ""}
    with pytest.raises(OperationalError, match="cannot write"):
        _store.store_record(state, record, durable=False)
    assert [p.name for p in (state / "results").iterdir()] == ["a.json"]  # no temp left


def test_staging_names_the_units_it_handed_as_held_units_finds_them(state: Path) -> None:
    p = plan(
        task("p", emits_files=["out/**"]),
        task("c", needs=["p"]),
        task("lone"),
        version=2,
    )
    settle(p, state, "p", None, files={"out/f": b"data"})
    sd = StateDir(p, state)
    staged = sd.stage_inputs("c", state / "work" / "c")
    assert staged.held and list(staged.held) == held_units(sd.view, state, "c")
    lone = sd.stage_inputs("lone", state / "work" / "lone")
    assert lone.held == () and held_units(sd.view, state, "lone") == []


def test_a_workspace_path_taken_by_a_file_is_refused(state: Path) -> None:
    from crucible.core.errors import OperationalError

    p = plan(task("lone"), version=2)
    (state / "work").mkdir()
    (state / "work" / "lone").write_bytes(b"")
    with pytest.raises(OperationalError, match="cannot create workspace: File exists"):
        StateDir(p, state).stage_inputs("lone", state / "work" / "lone")


def test_an_old_inputs_tree_in_an_existing_workspace_is_dropped(state: Path) -> None:
    p = plan(task("lone"), version=2)
    ws = state / "work" / "lone"
    (ws / "inputs" / "old").mkdir(parents=True)
    staged = StateDir(p, state).stage_inputs("lone", ws)
    assert not (ws / "inputs").exists()
    assert staged.env["CRUCIBLE_INPUTS_DIR"].endswith("shared/@empty")


def test_a_result_read_by_its_size_still_reads_what_grew_and_keeps_the_bound(
    tmp_path: Path,
) -> None:
    from crucible.stage._capture import _read_sized

    f = tmp_path / "out.json"
    f.write_bytes(b"x" * 70_000)  # more than fstat said (size 0: a /proc file, a growing one)
    fd = os.open(f, os.O_RDONLY)
    try:
        assert _read_sized(fd, 0, 100_000) == b"x" * 70_000
        os.lseek(fd, 0, os.SEEK_SET)
        assert _read_sized(fd, 70_000, 70_000) == b"x" * 70_000  # exactly the bound
        os.lseek(fd, 0, os.SEEK_SET)
        with pytest.raises(OverflowError):
            _read_sized(fd, 2, 69_999)
        os.lseek(fd, 0, os.SEEK_SET)
        with pytest.raises(OverflowError):
            _read_sized(fd, 70_000, 69_999)
    finally:
        os.close(fd)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    fd = os.open(empty, os.O_RDONLY)
    try:
        assert _read_sized(fd, 0, 10) == b""
    finally:
        os.close(fd)


def test_requests_split_across_reads_or_sharing_one_are_each_served(tmp_path: Path) -> None:
    from crucible.run.executors._workers import _frame, _next_request

    r, w = os.pipe()
    try:
        first, second = _frame((1, "a" * 10)), _frame((2, "b" * 100_000))
        os.write(w, first + second[:7])  # one read holds a request and a part of the next
        pending = bytearray()
        import pickle

        assert pickle.loads(_next_request(r, pending) or b"") == (1, "a" * 10)
        import threading

        writer = threading.Thread(target=lambda: os.write(w, second[7:]))
        writer.start()
        assert pickle.loads(_next_request(r, pending) or b"") == (2, "b" * 100_000)
        writer.join()
        assert pending == bytearray()
        os.close(w)
        w = -1
        assert _next_request(r, pending) is None  # the dispatcher closed its end
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_store_record_where_names_the_files_store_record_writes(state: Path) -> None:
    plain = {"format": _store.RESULT_FORMAT, "task": "a", "status": "passed", "note": ""}
    where = _store.store_record_where(state, plain, durable=False)
    assert where == (str(_store.plain_path(state, "a")), str(state / "results"))
    assert canon.loads(Path(where[0]).read_bytes()) == plain
    keyed = {**plain, "task": "m", "key": "k1"}
    where = _store.store_record_where(state, keyed, durable=False)
    assert where == (str(_store.packed_path(state, "m")), str(state / "results"))
    assert _store.load_keyed(state, "m")["k1"] == keyed
    from crucible.core.errors import InputRefused

    with pytest.raises(InputRefused):
        _store.store_record_where(state, {**plain, "task": "../x"}, durable=False)
    assert not (state / "x.json").exists()
