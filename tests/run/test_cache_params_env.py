"""Issue 34 items 3 and 4 through real ``crucible-dispatch --cache`` runs: a task
is keyed on the params it lists (``params``), a fan-out instance on its own item,
and the environment by variable, with PATH keyed as the programs it resolves
(docs/spec/cache.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from tests.run.dispatchtests import DISPATCH

# prep and count read no param; merge reads top; sweep fans out over t0 x t1.
PACK = """edition = 4

[workflow]
name = "stats"

[workflow.params]
top = { type = "integer", default = 10 }
t0 = { type = "array", default = [1, 10, 100] }
t1 = { type = "array", default = ["a", "b"] }

[[workflow.task]]
name = "prep"
params = []
env = ["COUNT", "X"]
emits = { n = "integer" }
run = 'echo prep >> "$COUNT"; echo "{\\"n\\": 5}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "count"
needs = ["prep"]
params = []
env = ["COUNT"]
inputs = { n = "prep.n" }
emits = { n = "integer" }
run = 'echo count >> "$COUNT"; echo "{\\"n\\": $(cat "$CRUCIBLE_INPUTS_DIR/n")}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "sweep"
params = ["t0", "t1"]
env = ["COUNT"]
matrix = { t0 = "params.t0", t1 = "params.t1" }
run = 'echo "sweep" >> "$COUNT"; cat "$CRUCIBLE_INPUTS_DIR/item" > /dev/null'

[[workflow.task]]
name = "merge"
needs = ["count"]
params = ["top"]
env = ["COUNT"]
inputs = { n = "count.n" }
emits = { top = "integer" }
run = 'echo merge >> "$COUNT"; python3 -c "import json; print(json.dumps({\\"top\\": json.load(open(\\"inputs/@values/params\\"))[\\"top\\"]}))" > "$CRUCIBLE_OUTPUT"'
"""


class Runs:
    def __init__(self, tmp: Path, pack: str = PACK) -> None:
        self.tmp = tmp
        self.pack = tmp / "pack.toml"
        self.pack.write_text(pack)
        self.cache = tmp / "cache"
        self.count = tmp / "count"
        self.n = 0

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
        env["COUNT"] = str(self.count)
        env.update(extra)
        return env

    def run(self, *args: str, env: dict[str, str] | None = None) -> list[str]:
        """One cached run into a new state dir: the tasks spawned, sorted."""
        self.n += 1
        self.count.write_text("")
        state = self.tmp / f"s{self.n}"
        proc = subprocess.run(
            [DISPATCH, str(self.pack), "--state", str(state), "--cache", str(self.cache), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env or self.env(),
        )
        assert proc.returncode == 0, proc.stderr
        return sorted(self.count.read_text().split())

    def dry(self, *args: str, env: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
        state = self.tmp / f"s{self.n + 1}"
        proc = subprocess.run(
            [DISPATCH, str(self.pack), "--state", str(state), "--cache", str(self.cache),
             "-n", "--json", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env or self.env(),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        return {line["task"]: line for line in lines}


def test_a_param_reruns_only_the_tasks_that_list_it(tmp_path: Path) -> None:
    r = Runs(tmp_path)
    assert r.run() == ["count", "merge", "prep"] + ["sweep"] * 6
    assert r.run() == []
    assert r.run("-p", "top=20") == ["merge"]
    result = json.loads((tmp_path / f"s{r.n}" / "results" / "merge.json").read_text())
    assert result["output"] == {"top": 20}
    assert r.run("-p", "top=20") == []


def test_a_task_is_handed_only_the_params_it_lists(tmp_path: Path) -> None:
    r = Runs(tmp_path)
    r.run()
    merge = json.loads((tmp_path / "s1" / "results" / "merge.json").read_text())
    assert merge["output"] == {"top": 10}  # read from inputs/@values/params
    r.pack.write_text(PACK.replace('["top"]', '["t1"]'))
    r.count.write_text("")
    done = subprocess.run(
        [DISPATCH, str(r.pack), "--state", str(tmp_path / "other")],
        capture_output=True, text=True, timeout=120, env=r.env(),
    )  # fmt: skip
    assert done.returncode == 1  # merge reads top, which it no longer lists: absent
    assert "KeyError: 'top'" in (tmp_path / "other" / "logs" / "merge.log").read_text()


def test_narrowing_a_matrix_axis_reuses_every_remaining_combination(tmp_path: Path) -> None:
    r = Runs(tmp_path)
    r.run()
    assert r.run("-p", "t0=[1,10]") == []  # 4 combinations, all computed before
    assert r.run("-p", "t0=[1,10,100,1000]") == ["sweep", "sweep"]  # only the new ones


def test_an_extra_path_entry_providing_nothing_hits_everything(tmp_path: Path) -> None:
    r = Runs(tmp_path)
    r.run()
    extra = tmp_path / "venv" / "bin"
    extra.mkdir(parents=True)
    (extra / "unrelated-tool").write_text("#!/bin/sh\n")
    (extra / "unrelated-tool").chmod(0o755)
    path = f"{extra}{os.pathsep}{os.environ['PATH']}"
    assert r.run(env=r.env(PATH=path)) == []
    # a python3 in front of PATH is another program for merge (and merge only)
    python = shutil.which("python3")
    assert python is not None
    (extra / "python3").symlink_to(Path(python).resolve().parent / "pydoc3")  # not python3
    lines = r.dry(env=r.env(PATH=path))
    assert lines["merge"]["cache"] == "miss"
    assert "changed program 'python3'" in lines["merge"]["reason"]
    assert lines["prep"]["cache"] == "hit"


def test_a_miss_names_every_variable_that_changed(tmp_path: Path) -> None:
    r = Runs(tmp_path)
    r.run(env=r.env(X="1", TZ="UTC"))
    lines = r.dry(env=r.env(X="2", TZ="Europe/Paris"))
    assert lines["prep"]["reason"].endswith("cache miss: changed environment variable TZ, X")
    assert lines["sweep"]["reason"].endswith("cache miss: changed environment variable TZ")
    lines = r.dry(env={k: v for k, v in r.env(TZ="UTC").items() if k != "X"})
    assert lines["prep"]["reason"].endswith("cache miss: changed environment variable X")


def test_the_report_says_why_each_unit_ran(tmp_path: Path) -> None:
    r = Runs(tmp_path)
    r.run(env=r.env(X="1", TZ="UTC"))
    assert r.run(env=r.env(X="2", TZ="UTC")) == ["prep"]  # count's input is unchanged
    state = str(tmp_path / f"s{r.n}")
    table = subprocess.run(
        [DISPATCH, "report", state], capture_output=True, text=True, timeout=60
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if line.startswith("prep "))
    assert "cache miss: changed environment variable X" in row
    rows = subprocess.run(
        [DISPATCH, "report", state, "--json"], capture_output=True, text=True, timeout=60
    )  # fmt: skip
    by_task = {row["task"]: row for row in map(json.loads, rows.stdout.splitlines())}
    assert by_task["prep"]["cache_miss"] == "changed environment variable X"
    assert "cache_miss" not in by_task["count"] and by_task["count"]["cached"] is True


def test_dry_run_counts_per_action_and_a_fanout_as_one_line(tmp_path: Path) -> None:
    r = Runs(tmp_path)
    r.run()
    state = tmp_path / "next"
    proc = subprocess.run(
        [DISPATCH, str(r.pack), "--state", str(state), "--cache", str(r.cache), "-n",
         "-p", "t0=[1,10,1000]", "-p", "top=4"],
        capture_output=True, text=True, timeout=120, env=r.env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    head, *rows = proc.stdout.splitlines()
    assert head == "9 units: 3 run, 6 cached, 0 kept, 0 skipped"
    assert [row.split()[:2] for row in rows] == [["run", "sweep"], ["run", "merge"]]
    assert "sweep (2 of 6 instances)" in rows[0]
    assert "cache miss: new instance" in rows[0] or "never run" in rows[0]
    assert "cache miss: changed input 'params'" in rows[1]


def test_widening_a_literal_axis_in_the_manifest_runs_only_the_new_combinations(
    tmp_path: Path,
) -> None:
    r = Runs(tmp_path, PACK.replace('t1 = "params.t1"', 't1 = ["a", "b"]'))
    r.run()
    r.pack.write_text(r.pack.read_text().replace('t1 = ["a", "b"]', 't1 = ["a", "b", "c"]'))
    assert r.run() == ["sweep"] * 3  # t1 = c with each t0
    r.pack.write_text(
        r.pack.read_text()
        .replace("parallelism", "x")
        .replace('name = "sweep"\n', 'name = "sweep"\nparallelism = 2\n')
    )
    assert r.run() == []  # a scheduling bound reruns nothing
