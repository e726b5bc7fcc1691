"""Cache hits keyed before staging and restored on the scheduling thread
(docs/spec/cache.md, "When a unit is keyed"), through real subprocesses: a
hit leaves no workspace or other per-unit directory behind, a changed file
still misses, and units that hit and units that run mix in one run."""

from __future__ import annotations

import json
from pathlib import Path

from tests.packed import keyed
from tests.run.cachetests import PACK, Runner
from tests.run.test_cache_run import MAPPED

#: what a state holds after a run whose every unit was restored from the cache
HIT_ONLY_ENTRIES = {
    "lock", "params.json", "plan.json", "environ.json", "results", "session.jsonl", "files"
}  # fmt: skip


def _events(state: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (state / "session.jsonl").read_text().splitlines()]


def test_a_hit_stages_nothing_and_creates_no_unit_directories(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    r.run()
    assert (r.state(1) / "work" / "b" / "inputs").is_dir()  # a run stages
    ran, _ = r.run()
    assert ran == []
    state = r.state(2)
    entries = {p.name for p in state.iterdir()}
    assert entries <= HIT_ONLY_ENTRIES, entries - HIT_ONLY_ENTRIES
    assert not (state / "work").exists() and not (state / "output").exists()
    # the files come back for the unit that captured them, and only for it
    assert sorted(p.name for p in (state / "files").iterdir()) == ["a"]
    assert sorted(p.name for p in (state / "results").iterdir()) == [
        "a.json",
        "b.json",
        "c.json",
        "d.json",
    ]


def test_mapped_hits_create_no_workspaces(tmp_path: Path) -> None:
    r = Runner(tmp_path, MAPPED)
    r.run()
    ran, _ = r.run()
    assert ran == []
    assert not (r.state(2) / "work").exists()
    assert sorted(keyed(r.state(2), "each")) == ["0", "1"]
    assert not (r.state(2) / "results" / "each").exists()


# `a` is never cached and copies a host file into its captured file: whatever it
# reads, its consumers are keyed on the bytes it captured this run.
FILE_PACK = (
    PACK.replace('name = "a"\n', 'name = "a"\ncache = false\n')
    .replace('echo "data$X" > out/a.txt', 'cat "$SRC" > out/a.txt')
    .replace('env = ["X"]', 'env = ["X", "SRC", "COUNT"]')
)


def test_a_changed_input_file_still_misses(tmp_path: Path) -> None:
    src = tmp_path / "src.txt"
    src.write_text("one\n")
    r = Runner(tmp_path, FILE_PACK)
    ran, _ = r.run(env=r.env(SRC=str(src)))
    assert ran == ["a", "b", "c", "d"]
    ran, _ = r.run(env=r.env(SRC=str(src)))
    assert ran == ["a"]  # same bytes captured: b and c hit once a settled
    src.write_text("two\n")
    ran, _ = r.run(env=r.env(SRC=str(src)))
    assert ran == ["a", "b", "c"]  # b and c are handed a's files: both miss
    assert (r.state(3) / "work" / "b" / "seen.txt").read_text() == "two\n"
    finished = {e["task"]: e for e in _events(r.state(3)) if e["event"] == "task_finished"}
    assert finished["d"]["cached"] is True and "cached" not in finished["b"]


def test_a_producer_that_reruns_to_the_same_output_lets_its_consumers_hit(
    tmp_path: Path,
) -> None:
    """Consumers are keyed when they become ready, after the producer ran in a
    worker this run: the same output and files mean a hit."""
    r = Runner(tmp_path)
    r.run()
    r.pack.write_text(r.pack.read_text().replace("mkdir -p out &&", "mkdir -p out  &&"))
    ran, _ = r.run()
    assert ran == ["a"]
    finished = {e["task"]: e for e in _events(r.state(2)) if e["event"] == "task_finished"}
    assert "cached" not in finished["a"]
    assert all(finished[t]["cached"] is True for t in ("b", "c", "d"))


CHAIN = 120


def test_a_long_chain_hits_in_one_pass(tmp_path: Path) -> None:
    """Each hit readies the next unit, which is looked up in the same pass: no
    recursion, however long the chain."""
    body = ['edition = 4\n\n[workflow]\nname = "chain"\n']
    for i in range(CHAIN):
        needs = f'needs = ["t{i - 1}"]\n' if i else ""
        body.append(
            f'[[workflow.task]]\nname = "t{i}"\n{needs}env = ["COUNT"]\n'
            f"run = 'echo t{i} >> \"$COUNT\"'\n"
        )
    r = Runner(tmp_path, "\n".join(body))
    ran, _ = r.run()
    assert len(ran) == CHAIN
    ran, _ = r.run()
    assert ran == []
    finished = [e for e in _events(r.state(2)) if e["event"] == "task_finished"]
    assert [e["task"] for e in finished] == [f"t{i}" for i in range(CHAIN)]


def test_instances_under_a_parallelism_limit_all_hit(tmp_path: Path) -> None:
    pack = MAPPED.replace('map = "src.xs"\n', 'map = "src.xs"\nparallelism = 1\n')
    r = Runner(tmp_path, pack)
    assert r.run()[0] == ["after", "each0", "each1", "src"]
    assert r.run()[0] == []
    # a changed instance body reruns both instances, one at a time, then `after`
    r.pack.write_text(r.pack.read_text().replace("> f.txt", ">  f.txt"))
    assert r.run()[0] == ["each0", "each1"]


# `a` captures a file larger than the scheduling thread checks itself
BIG = 5 << 20
BIG_PACK = PACK.replace(
    'echo "data$X" > out/a.txt',
    f'echo "data$X" > out/a.txt && head -c {BIG} /dev/zero > out/big.txt',
)


def test_a_hit_with_large_files_is_restored_by_a_worker_without_staging(tmp_path: Path) -> None:
    from crucible.run.cache._hits import INLINE_BYTES

    assert BIG > INLINE_BYTES
    r = Runner(tmp_path, BIG_PACK)
    r.run()
    ran, _ = r.run()
    assert ran == []
    state = r.state(2)
    assert (state / "files" / "a" / "out" / "big.txt").stat().st_size == BIG
    assert not (state / "work").exists()
    finished = {e["task"]: e for e in _events(state) if e["event"] == "task_finished"}
    assert all(e["cached"] is True for e in finished.values())
    assert finished["a"]["files_bytes"] == BIG + len("data\n")
    # altered in the store: one warning (the worker checks it, not both), a runs
    [stored] = [
        p
        for p in (r.cache / "files" / "sha256").rglob("*")
        if p.is_file() and p.stat().st_size == BIG
    ]
    stored.chmod(0o644)
    with stored.open("r+b") as f:
        f.write(b"x")
    ran, proc = r.run()
    assert ran == ["a"]
    err = proc.stderr.decode()
    assert err.count("warning: cache: store file") == 1, err
    # the rerun stored its file again over the altered one: the next run hits
    ran, proc = r.run()
    assert ran == [] and b"warning" not in proc.stderr, proc.stderr


def test_a_record_of_the_wrong_shape_is_a_warned_miss(tmp_path: Path) -> None:
    """A ledger record for the key whose files are not a list of entries (a
    hand-edited ledger) is one warning, and the unit runs."""
    from crucible.ledger import Ledger, Outcome

    r = Runner(tmp_path)
    r.run()
    r.run()
    step = "unit:" + str(r.finished(2)["d"]["cache_key"])
    record = json.loads((r.state(1) / "results" / "d.json").read_text())
    with Ledger(r.cache) as ledger:
        ledger.record("dispatch", step, Outcome.ok({"record": record, "files": "junk"}))
    ran, proc = r.run()
    assert ran == ["d"]
    err = proc.stderr.decode()
    assert err.count("warning: cache: cannot use the record of 'd'") == 1, err


def test_a_plan_with_a_loop_runs_uncached(tmp_path: Path) -> None:
    """A scored loop's revisions are not keyed before staging (docs/spec/cache.md):
    with --cache, such a plan runs as without it, twice, and nothing is a hit."""
    import subprocess

    from tests.run.dispatchtests import DISPATCH

    repo = Path(__file__).resolve().parents[2]
    for n in (1, 2):
        state = tmp_path / f"state{n}"
        proc = subprocess.run(
            [DISPATCH, str(repo / "examples" / "loop" / "pack.toml"), "--state", str(state),
             "--cache", str(tmp_path / "cache")],
            capture_output=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert not any(e.get("cached") for e in _events(state)), n
