"""Issue 34 item 5: after any edit of the pack, ``crucible-dispatch PACK --state S
--reuse`` reruns exactly the units whose key changed and their dependants,
reusing every other unit of the earlier run (docs/spec/cache.md, "After an
edit: --reuse"); ``--resume`` still refuses a changed plan, and says what
changed and that command. Real subprocesses throughout."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.run.dispatchtests import DISPATCH

# a -> b -> c; d on its own; e after b (reads nothing of it but its status)
PACK = """edition = 4

[workflow]
name = "edit"

[workflow.params]
top = { type = "integer", default = 3 }

[[workflow.task]]
name = "a"
params = []
env = ["COUNT"]
emits = { n = "integer" }
emits_files = ["out.txt"]
run = 'echo a >> "$COUNT"; echo data > out.txt; echo "{\\"n\\": 1}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "b"
needs = ["a"]
params = []
env = ["COUNT"]
inputs = { n = "a.n" }
emits = { m = "integer" }
run = 'echo b >> "$COUNT"; echo "{\\"m\\": $(( $(cat "$CRUCIBLE_INPUTS_DIR/n") + 1 ))}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "c"
needs = ["b"]
params = ["top"]
env = ["COUNT"]
inputs = { m = "b.m" }
emits = { m = "integer" }
run = 'echo c >> "$COUNT"; echo "{\\"m\\": $(cat "$CRUCIBLE_INPUTS_DIR/m")}" > "$CRUCIBLE_OUTPUT"'

[[workflow.task]]
name = "d"
params = []
env = ["COUNT"]
description = "on its own"
run = 'echo d >> "$COUNT"'
"""


class Loop:
    def __init__(self, tmp: Path) -> None:
        self.pack = tmp / "pack.toml"
        self.pack.write_text(PACK)
        self.state = tmp / "run"
        self.count = tmp / "count"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CRUCIBLE_")}
        env["COUNT"] = str(self.count)
        return env

    def dispatch(self, *args: str, code: int = 0) -> subprocess.CompletedProcess[str]:
        self.count.write_text("")
        proc = subprocess.run(
            [DISPATCH, str(self.pack), "--state", str(self.state), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=self.env(),
        )
        assert proc.returncode == code, proc.stderr
        return proc

    def ran(self) -> list[str]:
        return sorted(self.count.read_text().split())

    def edit(self, old: str, new: str) -> None:
        text = self.pack.read_text()
        assert old in text
        self.pack.write_text(text.replace(old, new))

    def result(self, task: str) -> dict[str, object]:
        return dict(json.loads((self.state / "results" / f"{task}.json").read_text()))


def test_after_an_edit_reuse_reruns_that_task_and_its_dependants(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.dispatch("--reuse")  # the first time: nothing to reuse, everything runs
    assert loop.ran() == ["a", "b", "c", "d"]
    loop.dispatch("--reuse")
    assert loop.ran() == []  # nothing changed: every unit reused
    assert loop.result("c")["output"] == {"m": 2}
    assert loop.result("c")["cached"] is True

    loop.edit('echo "{\\"n\\": 1}"', 'echo "{\\"n\\": 5}"')  # a's run
    refused = loop.dispatch("--resume", code=1)
    assert "tasks changed: a" in refused.stderr
    assert f"--state {loop.state} --reuse" in refused.stderr
    dry = loop.dispatch("--reuse", "-n")
    assert dry.stdout.splitlines()[0] == "4 units: 3 run, 1 cached, 0 kept, 0 skipped"
    assert [line.split()[1] for line in dry.stdout.splitlines()[1:]] == ["a", "b", "c"]
    loop.dispatch("--reuse")
    assert loop.ran() == ["a", "b", "c"]  # exactly a and its dependants
    assert loop.result("c")["output"] == {"m": 6}  # nothing stale
    assert (loop.state / "files" / "a" / "out.txt").read_text() == "data\n"

    loop.edit('description = "on its own"', 'description = "alone"')
    refused = loop.dispatch("--resume", code=1)
    assert "descriptions changed: d" in refused.stderr
    loop.dispatch("--reuse")
    assert loop.ran() == []  # a description is not in any key

    loop.dispatch("--reuse", "-p", "top=4")
    assert loop.ran() == ["c"]  # only the task that lists top


def test_reuse_sees_a_changed_environment(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.edit(
        'name = "d"\nparams = []\nenv = ["COUNT"]', 'name = "d"\nparams = []\nenv = ["COUNT", "X"]'
    )
    loop.dispatch()
    loop.count.write_text("")
    env = {**loop.env(), "X": "2"}
    proc = subprocess.run(
        [DISPATCH, str(loop.pack), "--state", str(loop.state), "--reuse"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert loop.ran() == ["d"]  # the one task handed X


def test_reuse_keys_each_unit_under_the_session_it_passed_in(tmp_path: Path) -> None:
    # README's daily loop: a variable makes d fail; the fix unsets it and
    # resumes; then an edit. d passed in the resumed session (without X), a, b,
    # c in the first (with X): each is keyed under its own session's environment.
    loop = Loop(tmp_path)
    loop.edit(
        'name = "d"\nparams = []\nenv = ["COUNT"]', 'name = "d"\nparams = []\nenv = ["COUNT", "X"]'
    )
    loop.edit("run = 'echo d >> \"$COUNT\"'", "run = 'echo d >> \"$COUNT\"; test -z \"$X\"'")

    def run(*args: str, code: int, **extra: str) -> None:
        loop.count.write_text("")
        proc = subprocess.run(
            [DISPATCH, str(loop.pack), "--state", str(loop.state), *args],
            capture_output=True, text=True, timeout=120, env={**loop.env(), **extra},
        )  # fmt: skip
        assert proc.returncode == code, proc.stderr

    run(code=1, X="1")
    run("--resume", "--retry-failed", code=0)
    assert loop.ran() == ["d"]
    environ = json.loads((loop.state / "environ.json").read_text())
    assert environ["environ"]["X"] == "1"
    assert [(e["session"], "X" in e["environ"]) for e in environ["later"]] == [(2, False)]
    loop.edit('echo "{\\"n\\": 1}"', 'echo "{\\"n\\": 5}"')  # a's run
    run("--reuse", code=0)
    assert loop.ran() == ["a", "b", "c"]  # d reused under the environment it passed in
    assert loop.result("d")["cached"] is True


def test_reuse_and_resume_are_one_or_the_other(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    refused = loop.dispatch("--reuse", "--resume", code=2)
    assert "--reuse" in refused.stderr and not loop.state.exists()


def test_reuse_records_the_earlier_run_in_a_given_cache(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    cache = tmp_path / "cache"
    loop.dispatch()  # without a cache
    loop.edit('params = ["top"]\nenv', "params = []\nenv")  # c no longer reads top
    loop.dispatch("--reuse", "--cache", str(cache))
    assert loop.ran() == ["c"]
    assert sorted(p.name for p in (cache / "last").iterdir()) == ["a", "b", "c", "d"]
    other = tmp_path / "other"  # a new state dir: the cache alone reuses them all
    loop.count.write_text("")
    proc = subprocess.run(
        [DISPATCH, str(loop.pack), "--state", str(other), "--cache", str(cache)],
        capture_output=True, text=True, timeout=120, env=loop.env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert loop.count.read_text() == ""
    assert not any(p.name.startswith(".run.reuse-") for p in tmp_path.iterdir())


def test_a_unit_whose_files_are_gone_runs_again_and_the_rest_are_reused(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.dispatch()
    (loop.state / "files" / "a" / "out.txt").unlink()  # a's captured file, lost
    leftover = tmp_path / ".run.reuse-killed"  # what a SIGKILLed --reuse leaves
    leftover.mkdir()
    done = loop.dispatch("--reuse")
    assert loop.ran() == ["a"]  # b's inputs are the same again: reused
    assert "--reuse: cannot reuse a (" in done.stderr
    assert not leftover.exists()
    assert (loop.state / "files" / "a" / "out.txt").read_text() == "data\n"


def test_a_run_without_environ_json_is_reused_for_nothing(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.dispatch()
    (loop.state / "environ.json").unlink()  # as a run of an older engine
    done = loop.dispatch("--reuse")
    assert loop.ran() == ["a", "b", "c", "d"]
    assert "records no environment" in done.stderr


def test_the_plan_changed_refusal_names_added_removed_and_params(tmp_path: Path) -> None:
    loop = Loop(tmp_path)
    loop.dispatch()
    loop.edit('[[workflow.task]]\nname = "d"', '[[workflow.task]]\nname = "e"')
    loop.edit('top = { type = "integer", default = 3 }', 'top = { type = "integer", default = 4 }')
    refused = loop.dispatch("--resume", code=1)
    line = refused.stderr.strip()
    assert "\n" not in line
    assert "tasks added: e; tasks removed: d; params declared differently: top" in line
    assert line.endswith(f"crucible-dispatch {loop.pack} --state {loop.state} --reuse")
