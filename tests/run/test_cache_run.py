"""``crucible-dispatch --cache DIR`` end to end, through real subprocesses
(docs/spec/cache.md): a task process is counted by the line it appends to a file
outside the state directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

from tests.packed import keyed
from tests.run.cachetests import PACK, Runner
from tests.run.dispatchtests import DISPATCH


def test_second_run_spawns_nothing_and_restores_everything(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    ran, _ = r.run()
    assert ran == ["a", "b", "c", "d"]
    ran, _ = r.run()
    assert ran == []
    events = r.finished(2)
    assert all(e["cached"] is True and e["status"] == "passed" for e in events.values())
    assert all(str(e["cache_key"]).startswith("sha256:") for e in events.values())
    assert not any(
        json.loads(line)["event"] == "task_started"
        for line in (r.state(2) / "session.jsonl").read_text().splitlines()
    )
    # the record is the captured one, marked cached; the files are back
    first = json.loads((r.state(1) / "results" / "a.json").read_text())
    second = json.loads((r.state(2) / "results" / "a.json").read_text())
    assert second.pop("cached") is True
    assert second.pop("cache_key") == events["a"]["cache_key"]
    assert second == first
    assert (r.state(2) / "files" / "a" / "out" / "a.txt").read_text() == "data\n"
    schemas = Path(__file__).resolve().parents[2] / "docs" / "schemas"
    jsonschema.validate(
        json.loads((r.state(2) / "results" / "a.json").read_text()),
        json.loads((schemas / "result-record.json").read_text()),
    )
    event_schema = json.loads((schemas / "session-event.json").read_text())
    for event in events.values():
        jsonschema.validate(event, event_schema)
    report = subprocess.run(
        [DISPATCH, "report", str(r.state(2))], capture_output=True, check=True
    ).stdout.decode()
    assert report.count("passed (cached)") == 4


def test_changed_upstream_output_reruns_only_dependants(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    r.run()
    # X is declared by a: a misses, its output and file change, so b misses, and
    # c too (a's files are staged for every descendant); d does not depend on a
    ran, _ = r.run(env=r.env(X="5"))
    assert ran == ["a", "b", "c"]
    assert (r.state(2) / "work" / "b" / "seen.txt").read_text() == "data5\n"


def test_changed_run_and_delivered_param_miss(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    r.run()
    r.pack.write_text(r.pack.read_text().replace("echo d >>", "echo d  >>"))
    ran, _ = r.run()
    assert ran == ["d"]
    # params are delivered to every task (the reserved input `params`)
    ran, _ = r.run("-p", "n=2")
    assert ran == ["a", "b", "c", "d"]
    ran, _ = r.run("-p", "n=2")
    assert ran == []


def test_undeclared_host_env_hits(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    r.run(env=r.env(UNDECLARED="1"))
    ran, _ = r.run(env=r.env(UNDECLARED="2"))
    assert ran == []


def test_changed_agent_cmd_misses(tmp_path: Path) -> None:
    pack = (
        PACK
        + """
[[workflow.task]]
name = "ask"
kind = "agent"
prompt = "Say hello."
env = ["COUNT"]
"""
    )
    r = Runner(tmp_path, pack)
    agent = 'echo ask >> "$COUNT"; echo "{}" > "$CRUCIBLE_OUTPUT"'
    ran, _ = r.run("--agent-cmd", agent)
    assert "ask" in ran
    ran, _ = r.run("--agent-cmd", agent)
    assert ran == []
    ran, _ = r.run("--agent-cmd", agent + " ")
    assert ran == ["ask"]


def test_cache_false_always_runs(tmp_path: Path) -> None:
    r = Runner(tmp_path, PACK.replace('name = "d"\n', 'name = "d"\ncache = false\n'))
    r.run()
    ran, _ = r.run()
    assert ran == ["d"]
    assert "cached" not in r.finished(2)["d"]


def test_cache_key_refused_before_edition_4_and_must_be_boolean(tmp_path: Path) -> None:
    old = PACK.replace("edition = 4", "edition = 3").replace(
        'name = "d"\n', 'name = "d"\ncache = false\n'
    )
    bad = PACK.replace('name = "d"\n', 'name = "d"\ncache = "no"\n')
    for pack, why in ((old, "cache"), (bad, "cache must be a boolean")):
        r = Runner(tmp_path, pack)
        ran, proc = r.run(code=None)
        assert proc.returncode in (1, 2), proc.stderr
        err = proc.stderr.decode()
        assert why in err and len(err.splitlines()) == 1, err
        assert ran == []


def test_tampered_store_file_is_a_warned_miss(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    r.run()
    store = (r.cache / "files" / "sha256").rglob("*")
    [stored] = [p for p in store if p.is_file() and p.read_bytes() == b"data\n"]  # a's file
    stored.chmod(0o644)
    stored.write_text("evil\n")
    ran, proc = r.run()
    assert ran == ["a"]  # b's inputs are a's real output again: b hits
    err = proc.stderr.decode()
    assert err.count("warning: cache: store file") == 1, err
    assert (r.state(2) / "files" / "a" / "out" / "a.txt").read_text() == "data\n"


@pytest.mark.parametrize("kind", ["file", "under-a-file"])
def test_unusable_cache_dir_runs_uncached_with_one_warning(tmp_path: Path, kind: str) -> None:
    r = Runner(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    r.cache = blocker if kind == "file" else blocker / "sub"
    ran, proc = r.run()
    assert ran == ["a", "b", "c", "d"]
    lines = [line for line in proc.stderr.decode().splitlines() if "warning" in line]
    assert len(lines) == 1 and str(r.cache) in lines[0] and "uncached" in lines[0], lines
    assert blocker.read_text() == "x"


def test_missing_cache_dir_is_created_and_env_var_works(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    where = tmp_path / "deep" / "cache"
    r.run(cache=False, env=r.env(CRUCIBLE_CACHE=str(where)))
    assert (where / "steps.jsonl").is_file()
    ran, _ = r.run(cache=False, env=r.env(CRUCIBLE_CACHE=str(where)))
    assert ran == []


def test_sigkill_of_the_dispatcher_leaves_a_cache_that_only_misses(tmp_path: Path) -> None:
    slow = PACK.replace("echo b >>", "sleep 0.3; echo b >>").replace(
        "echo c >>", "sleep 0.3; echo c >>"
    )
    r = Runner(tmp_path, slow)
    for delay in (0.15, 0.35, 0.55, 0.75):
        r.runs += 1
        proc = subprocess.Popen(
            [DISPATCH, str(r.pack), "--state", str(r.state(r.runs)), "--cache", str(r.cache)],
            env=r.env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(delay)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    ran, _ = r.run()
    n = r.runs
    assert (r.state(n) / "files" / "a" / "out" / "a.txt").read_text() == "data\n"
    assert (r.state(n) / "work" / "b" / "seen.txt").exists() or "b" not in ran
    assert json.loads((r.state(n) / "results" / "b.json").read_text())["output"] == {"m": 3}
    # whatever was cached is right: a second run hits everything
    ran, _ = r.run()
    assert ran == []


def _cache_cmd(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([DISPATCH, "cache", *args], capture_output=True, timeout=60)


def test_cache_forget_drops_one_task_and_gc_frees_its_files(tmp_path: Path) -> None:
    r = Runner(tmp_path)
    r.run()
    proc = _cache_cmd("forget", "a", "--cache", str(r.cache))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"forgotten": 1, "task": "a"}
    # the store file is still there but no live record names it
    proc = _cache_cmd("gc", "--cache", str(r.cache))
    assert json.loads(proc.stdout)["removed"] == 0  # within the grace period
    proc = _cache_cmd("gc", "--cache", str(r.cache), "--grace", "0")
    gone = json.loads(proc.stdout)
    # a's file and a's restored record go; b's, c's and d's restored records stay
    assert (gone["removed"], gone["kept"]) == (2, 3) and gone["bytes"] > 5, gone
    ran, proc = r.run()
    assert ran == ["a"], proc.stderr  # b's inputs are the same again: b and c hit
    assert "warning" not in proc.stderr.decode()
    proc = _cache_cmd("gc", "--cache", str(r.cache), "--grace", "0")
    assert json.loads(proc.stdout) == {"bytes": 0, "kept": 5, "removed": 0}  # 1 file, 4 records
    ls = subprocess.run(
        [str(Path(sys.executable).parent / "crucible-ledger"), "ls", "--dir", str(r.cache),
         "--scope", "dispatch"],
        capture_output=True, check=True,
    )  # fmt: skip
    tasks = sorted(json.loads(line)["key"]["task"] for line in ls.stdout.splitlines())
    assert tasks == ["a", "b", "c", "d"]


def test_cache_commands_bad_dirs(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert json.loads(_cache_cmd("gc", "--cache", str(missing)).stdout)["removed"] == 0
    assert json.loads(_cache_cmd("forget", "x", "--cache", str(missing)).stdout)["forgotten"] == 0
    assert not missing.exists()
    afile = tmp_path / "f"
    afile.write_text("x")
    proc = _cache_cmd("gc", "--cache", str(afile))
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == [
        f"crucible-dispatch: error: {afile}: not a directory"
    ]
    proc = subprocess.run(
        [DISPATCH, "cache", "gc"],
        capture_output=True,
        env={k: v for k, v in os.environ.items() if k != "CRUCIBLE_CACHE"},
    )
    assert proc.returncode == 2 and b"--cache DIR" in proc.stderr


def _dry(r: Runner, *args: str, env: dict[str, str] | None = None) -> list[dict[str, object]]:
    state = r.tmp / "dry-state"
    proc = subprocess.run(
        [DISPATCH, str(r.pack), "--state", str(state), "--cache", str(r.cache), "-n", "--json",
         *args],
        capture_output=True, timeout=60, env=env or r.env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert not state.exists()  # a dry run writes nothing
    return [json.loads(line) for line in proc.stdout.splitlines()]


def test_dry_run_says_hit_or_why_it_misses(tmp_path: Path) -> None:
    r = Runner(tmp_path, PACK.replace('name = "d"\n', 'name = "d"\ncache = false\n'))
    r.count.write_text("")
    assert all("cache" not in line for line in _dry(r))  # no cache dir yet: none created
    assert not r.cache.exists()
    r.cache.mkdir()
    before = {line["task"]: line["cache"] for line in _dry(r)}
    assert before == {"a": "miss", "b": "unknown", "c": "unknown", "d": "off"}
    r.run()
    r.count.write_text("")
    lines = {line["task"]: line for line in _dry(r)}
    assert [lines[t]["action"] for t in "abcd"] == ["cached", "cached", "cached", "run"]
    lines = {line["task"]: line for line in _dry(r, env=r.env(X="9"))}
    assert lines["a"]["cache"] == "miss"
    assert "changed environment variable X" in str(lines["a"]["reason"])
    assert lines["b"]["cache"] == "unknown" and "'a'" in str(lines["b"]["reason"])
    r.pack.write_text(r.pack.read_text().replace("cp inputs", "cp  inputs"))
    lines = {line["task"]: line for line in _dry(r)}
    assert lines["a"]["action"] == "cached"
    assert "cache miss: changed task definition" in str(lines["b"]["reason"])
    assert r.count.read_text() == ""  # nothing was spawned by any dry run
    text = subprocess.run(
        [DISPATCH, str(r.pack), "--state", str(tmp_path / "x"), "--cache", str(r.cache), "-n"],
        capture_output=True, env=r.env(), check=True,
    ).stdout.decode()  # fmt: skip
    assert text.startswith("4 units: 3 run, 1 cached, 0 kept, 0 skipped\n")  # then what runs
    assert "cached       a" not in text and "run          b" in text
    text = subprocess.run(
        [DISPATCH, str(r.pack), "--state", str(tmp_path / "x"), "--cache", str(r.cache), "-n",
         "--all"],
        capture_output=True, env=r.env(), check=True,
    ).stdout.decode()  # fmt: skip
    assert "cached       a" in text


MAPPED = """edition = 4

[workflow]
name = "mapped"

[[workflow.task]]
name = "src"
env = ["COUNT"]
emits = { xs = "array" }
run = 'echo src >> "$COUNT"; echo "{\\"xs\\": [\\"p\\", \\"q\\"]}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "each"
needs = ["src"]
env = ["COUNT"]
map = "src.xs"
emits_files = ["f.txt"]
run = 'echo "each$CRUCIBLE_KEY" >> "$COUNT"; echo "$CRUCIBLE_KEY" > f.txt'

[[workflow.task]]
name = "after"
needs = ["each"]
env = ["COUNT"]
run = 'echo after >> "$COUNT"'
"""


def test_mapped_instances_are_cached_one_by_one(tmp_path: Path) -> None:
    r = Runner(tmp_path, MAPPED)
    ran, _ = r.run()
    assert ran == ["after", "each0", "each1", "src"]
    ran, _ = r.run()
    assert ran == []
    for i, key in enumerate(("0", "1")):
        assert (r.state(2) / "files" / "each" / key / "f.txt").read_text() == f"{i}\n"
        rec = keyed(r.state(2), "each")[key]
        assert rec["cached"] is True and rec["key"] == key
    fold = json.loads((r.state(2) / "results" / "each.json").read_text())
    assert fold["status"] == "passed" and fold["keys"] == ["0", "1"]
