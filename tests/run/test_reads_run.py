"""Declared ``reads`` end to end (docs/spec/cache.md, "Declared reads"): real
``crucible-dispatch --cache`` subprocesses, each run into a new state dir; a
task process is counted by the line it appends to a file outside the pack."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.run.dispatchtests import DISPATCH

# count reads the CSV files (by path, under the pack dir), total consumes it,
# lister lists them, tok runs a script named in its reads, other reads nothing.
PACK = """edition = 4

[workflow]
name = "reads"

[[workflow.task]]
name = "count"
env = ["COUNT"]
reads = ["data/*.csv"]
emits = { n = "integer" }
run = 'echo count >> "$COUNT"; echo "{\\"n\\": $(cat "$CRUCIBLE_PACK_DIR"/data/*.csv | wc -w)}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "total"
needs = ["count"]
env = ["COUNT"]
inputs = { n = "count.n" }
emits = { n = "integer" }
run = 'echo total >> "$COUNT"; echo "{\\"n\\": $(cat "$CRUCIBLE_INPUTS_DIR/n")}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "lister"
env = ["COUNT"]
reads = ["data/*.csv"]
emits = { files = "integer" }
run = 'echo lister >> "$COUNT"; echo "{\\"files\\": $(ls "$CRUCIBLE_PACK_DIR"/data/*.csv | wc -l)}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "tok"
env = ["COUNT"]
reads = ["scripts/**/*.sh"]
emits = { out = "string" }
run = 'echo tok >> "$COUNT"; sh "$CRUCIBLE_PACK_DIR/scripts/tok.sh" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "other"
env = ["COUNT"]
reads = ["extra/*.txt"]
run = 'echo other >> "$COUNT"'
"""


class Pack:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "pack"
        (self.dir / "data").mkdir(parents=True)
        (self.dir / "scripts" / "lib").mkdir(parents=True)
        (self.dir / "pack.toml").write_text(PACK)
        (self.dir / "data" / "a.csv").write_text("one two\n")
        (self.dir / "data" / "b.csv").write_text("three\n")
        (self.dir / "scripts" / "lib" / "tok.sh").write_text("echo unused\n")
        (self.dir / "scripts" / "tok.sh").write_text('echo \'{"out": "v1"}\'\n')
        self.tmp = tmp
        self.count = tmp / "count"
        self.cache = tmp / "cache"
        self.runs = 0

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
        env["COUNT"] = str(self.count)
        return env

    def run(self, *args: str) -> tuple[list[str], subprocess.CompletedProcess[str]]:
        self.runs += 1
        self.count.write_text("")
        proc = subprocess.run(
            [DISPATCH, str(self.dir / "pack.toml"), "--state", str(self.state()), "--cache",
             str(self.cache), *args],
            capture_output=True, text=True, timeout=120, env=self.env(),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return sorted(self.count.read_text().split()), proc

    def dry(self) -> dict[str, str]:
        """task -> the dry run's reason (run into the next state dir, nothing written)."""
        proc = subprocess.run(
            [DISPATCH, str(self.dir / "pack.toml"), "--state", str(self.tmp / "dry"), "--cache",
             str(self.cache), "-n", "--json"],
            capture_output=True, text=True, timeout=120, env=self.env(),
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(line) for line in proc.stdout.splitlines()]
        return {line["task"]: line["reason"] for line in lines}

    def state(self) -> Path:
        return self.tmp / f"state{self.runs}"

    def output(self, task: str) -> object:
        return json.loads((self.state() / "results" / f"{task}.json").read_text())["output"]


def test_unchanged_reads_hit_everything(tmp_path: Path) -> None:
    p = Pack(tmp_path)
    ran, _ = p.run()
    assert ran == ["count", "lister", "other", "tok", "total"]
    ran, _ = p.run()
    assert ran == []


def test_appending_to_a_data_file_reruns_only_its_readers_with_the_right_answer(
    tmp_path: Path,
) -> None:
    p = Pack(tmp_path)
    p.run()
    assert p.output("total") == {"n": 3}
    with open(p.dir / "data" / "b.csv", "a") as f:
        f.write("four five\n")
    reasons = p.dry()
    assert "cache miss: read data/b.csv changed" in reasons["count"]
    assert "cache hit" in reasons["tok"]
    ran, _ = p.run()
    # the lister reads the same files (their bytes are in its key too); total is
    # count's dependant
    assert ran == ["count", "lister", "total"]
    assert p.output("total") == {"n": 5}
    # the report says why each reran, in its NOTE column and its JSON rows
    report = subprocess.run(
        [DISPATCH, "report", str(p.state()), "--json"], capture_output=True, text=True, check=True
    )
    rows = {row["task"]: row for row in map(json.loads, report.stdout.splitlines())}
    assert rows["count"]["cache_miss"] == "read data/b.csv changed"
    assert rows["total"]["cache_miss"] == "changed input 'n'"
    assert "cache_miss" not in rows["tok"] and rows["tok"]["cached"] is True
    table = subprocess.run(
        [DISPATCH, "report", str(p.state())], capture_output=True, text=True, check=True
    ).stdout
    assert "cache miss: read data/b.csv changed" in table


def test_a_file_the_glob_gains_reruns_the_lister(tmp_path: Path) -> None:
    p = Pack(tmp_path)
    p.run()
    assert p.output("lister") == {"files": 2}
    (p.dir / "data" / "c.csv").write_text("six\n")
    (p.dir / "data" / "notes.txt").write_text("not matched\n")
    assert "cache miss: read data/c.csv added" in p.dry()["lister"]
    ran, _ = p.run()
    assert ran == ["count", "lister", "total"]
    assert p.output("lister") == {"files": 3}
    (p.dir / "data" / "b.csv").unlink()
    assert "cache miss: read data/b.csv removed" in p.dry()["lister"]
    (p.dir / "data" / "b.csv").write_text("three\n")
    ran, _ = p.run()
    assert ran == []  # the same files as the second run's: every key recorded


def test_a_file_outside_the_globs_changes_nothing(tmp_path: Path) -> None:
    p = Pack(tmp_path)
    p.run()
    (p.dir / "data" / "notes.txt").write_text("not matched\n")
    (p.dir / "README").write_text("docs\n")
    ran, _ = p.run()
    assert ran == []


def test_editing_a_script_named_in_reads_reruns_its_task(tmp_path: Path) -> None:
    p = Pack(tmp_path)
    p.run()
    assert p.output("tok") == {"out": "v1"}
    (p.dir / "scripts" / "tok.sh").write_text('echo \'{"out": "v2"}\'\n')
    assert "cache miss: read scripts/tok.sh changed" in p.dry()["tok"]
    ran, _ = p.run()
    assert ran == ["tok"]
    assert p.output("tok") == {"out": "v2"}
    # a file under a ** directory is matched too
    (p.dir / "scripts" / "lib" / "tok.sh").write_text("echo changed\n")
    ran, _ = p.run()
    assert ran == ["tok"]


def test_a_glob_that_matched_nothing_misses_at_its_first_file(tmp_path: Path) -> None:
    p = Pack(tmp_path)
    p.run()
    (p.dir / "extra").mkdir()
    ran, _ = p.run()
    assert ran == []  # an empty directory: still no match
    (p.dir / "extra" / "first.txt").write_text("x\n")
    assert "cache miss: read extra/first.txt added" in p.dry()["other"]
    ran, _ = p.run()
    assert ran == ["other"]


def test_same_content_rewritten_is_a_hit(tmp_path: Path) -> None:
    """The key is the content: a rewrite with the same bytes (new mtime,
    ctime) is rehashed and hits."""
    p = Pack(tmp_path)
    p.run()
    (p.dir / "data" / "a.csv").write_text("one two\n")
    ran, _ = p.run()
    assert ran == []
