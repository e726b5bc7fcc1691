"""Issue 32 items 4-7 through real ``crucible-dispatch`` subprocesses: the
include-only matrix, ``on_empty``, sequences with ``format`` and params, and
``retry.when``; plus the start-up double run of a settled join."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path
from typing import Any

from tests.run.dispatchtests import DISPATCH


def dispatch(
    tmp_path: Path, toml: str, *args: str, state: str = "state"
) -> subprocess.CompletedProcess[str]:
    pack = tmp_path / "pack.toml"
    pack.write_text(textwrap.dedent(toml).lstrip())
    return subprocess.run(
        [DISPATCH, str(pack), "--state", str(tmp_path / state), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def events(state: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (state / "session.jsonl").read_text().splitlines()]


def finished(state: Path) -> dict[str, dict[str, Any]]:
    """task (``task[key]`` for an instance) -> its last ``task_finished``."""
    out = {}
    for e in events(state):
        if e["event"] == "task_finished":
            label = e["task"] if e.get("key") is None else f"{e['task']}[{e['key']}]"
            out[label] = e
    return out


def record(state: Path, task: str) -> dict[str, Any]:
    return json.loads((state / "results" / f"{task}.json").read_bytes())  # type: ignore[no-any-return]


# -- the start-up double run -------------------------------------------------------


def test_a_settled_join_after_a_start_up_skip_runs_once(tmp_path: Path) -> None:
    """A task skipped while the dispatcher starts wakes its consumers at once; the
    start-up walk then reached the same consumer: a settled join ran twice."""
    proc = dispatch(
        tmp_path,
        """
        edition = 4
        [workflow]
        name = "dbl"
        [[workflow.task]]
        name = "a"
        when = "False"
        run = "true"
        [[workflow.task]]
        name = "b"
        needs = ["a"]
        join = "settled"
        run = "echo ran >> \\"$CRUCIBLE_PACK_DIR/b.count\\""
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "b.count").read_text() == "ran\n"
    started = [e["task"] for e in events(tmp_path / "state") if e["event"] == "task_started"]
    assert started == ["b"]
    assert "1 passed, 0 failed, 1 skipped" in proc.stderr


# -- item 4: the include-only matrix -------------------------------------------------

#: each instance writes its key and item into its output
ECHO = (
    'run = \'printf "{\\"item\\": %s, \\"key\\": \\"%s\\"}" '
    '"$(cat "$CRUCIBLE_INPUTS_DIR/item")" "$CRUCIBLE_KEY" > "$CRUCIBLE_OUTPUT"\'\n'
)


def instance_outputs(state: Path, task: str) -> dict[str, Any]:
    """key -> output of each instance, in the aggregate record's order."""
    from crucible import stage

    out = {}
    for key in record(state, task)["keys"]:
        rec = stage.load_result(state, task, key)
        assert rec is not None
        out[key] = rec.get("output")
    return out


def test_an_include_only_matrix_runs_exactly_its_entries_in_order(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "inc"
        [[workflow.task]]
        name = "t"
        matrix = {{ include = [
          {{ os = "ubuntu-latest", python = "3.12" }},
          {{ os = "macos-latest", python = "3.11", experimental = true }},
        ] }}
        emits = {{ item = "object", key = "string" }}
        {ECHO}""",
    )
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    keys = ["os=ubuntu-latest,python=3.12", "experimental=true,os=macos-latest,python=3.11"]
    (admitted,) = [e for e in events(state) if e["event"] == "plan_admitted"]
    assert admitted["tasks"][0]["instances"] == keys
    assert admitted["tasks"][0]["matrix"] == []
    assert instance_outputs(state, "t") == {
        keys[0]: {"item": {"os": "ubuntu-latest", "python": "3.12"}, "key": keys[0]},
        keys[1]: {
            "item": {"experimental": True, "os": "macos-latest", "python": "3.11"},
            "key": keys[1],
        },
    }
    assert record(state, "t")["status"] == "passed"


def test_an_empty_axis_leaves_only_the_include_entries(tmp_path: Path) -> None:
    proc = dispatch(
        tmp_path,
        f"""
        edition = 4
        [workflow]
        name = "inc"
        [[workflow.task]]
        name = "t"
        matrix = {{ os = [], include = [{{ os = "solaris" }}] }}
        emits = {{ item = "object", key = "string" }}
        {ECHO}""",
    )
    assert proc.returncode == 0, proc.stderr
    assert instance_outputs(tmp_path / "state", "t") == {
        "os=solaris": {"item": {"os": "solaris"}, "key": "os=solaris"}
    }


# -- item 5: on_empty -------------------------------------------------------------------

ON_EMPTY = """
edition = 4
[workflow]
name = "emp"
[workflow.params.regions]
type = "array"
default = []
[[workflow.task]]
name = "deploy"
map = "params.regions"
{on_empty}
run = "true"
[[workflow.task]]
name = "announce"
needs = ["deploy"]
run = "echo announce >> \\"$CRUCIBLE_PACK_DIR/ran\\""
[[workflow.task]]
name = "cleanup"
needs = ["deploy"]
join = "settled"
run = "echo cleanup >> \\"$CRUCIBLE_PACK_DIR/ran\\""
"""


def test_on_empty_skip_settles_an_empty_fanout_skipped_and_skips_its_all_joins(
    tmp_path: Path,
) -> None:
    proc = dispatch(tmp_path, ON_EMPTY.format(on_empty='on_empty = "skip"'))
    assert proc.returncode == 0, proc.stderr
    state = tmp_path / "state"
    deploy = record(state, "deploy")
    assert (deploy["status"], deploy["keys"]) == ("skipped", [])
    assert deploy["note"] == 'skipped: the fan-out has no instances (on_empty = "skip")'
    done = finished(state)
    assert done["deploy"]["status"] == "skipped" and done["deploy"]["instances"] == 0
    assert done["announce"]["status"] == "skipped"
    assert done["announce"]["note"] == "skipped: needs 'deploy', which was skipped"
    assert done["cleanup"]["status"] == "passed"
    assert (tmp_path / "ran").read_text() == "cleanup\n"  # once: no start-up double run
    assert "1 passed, 0 failed, 2 skipped" in proc.stderr


def test_on_empty_pass_is_the_default_and_a_nonempty_fanout_runs(tmp_path: Path) -> None:
    proc = dispatch(tmp_path, ON_EMPTY.format(on_empty=""))
    assert proc.returncode == 0, proc.stderr
    assert record(tmp_path / "state", "deploy")["status"] == "passed"
    assert sorted((tmp_path / "ran").read_text().split()) == ["announce", "cleanup"]
    proc = dispatch(
        tmp_path, ON_EMPTY.format(on_empty='on_empty = "skip"'), "-p", 'regions=["eu"]', state="s2"
    )
    assert proc.returncode == 0, proc.stderr
    assert record(tmp_path / "s2", "deploy")["keys"] == ["0"]
    assert record(tmp_path / "s2", "deploy")["status"] == "passed"
