"""Issue 27's values that validate accepted and the run could not hold (items 6,
21): each refused at compile time, one diagnostic at its key, with words that
say what is wrong (docs/spec/manifest.md, "Durations")."""

from __future__ import annotations

from pathlib import Path

import pytest

from crucible.compile._durations import MAX_DURATION_S
from crucible.compile._manifest import analyze_manifest
from tests.compile.test_loop_validate import HEAD, TASKS, line_of, loop_text

TASK = 'edition = 4\n[workflow]\nname = "x"\n[[workflow.task]]\nname = "a"\nrun = "true"\n'


def found(text: str) -> list[tuple[str, str | None, str]]:
    analysis = analyze_manifest(text.encode(), "pack.toml", Path("."))
    return [(d.code, d.location.where(), d.message) for d in analysis.errors]


@pytest.mark.parametrize(
    ("line", "col", "what"),
    [
        ("timeout = 1e10", 1, "timeout"),
        ("timeout = 1e12", 1, "timeout"),
        ("timeout = 9007199254740991", 1, "timeout"),
        ("deadline = 1e12", 1, "deadline (seconds over all attempts)"),
        ("retry = { limit = 2, delay = 1e12 }", 22, "retry delay"),
        ("retry = { limit = 2, max_delay = 31536001 }", 22, "retry max_delay"),
    ],
)
def test_a_duration_past_a_year_is_refused_at_its_key(line: str, col: int, what: str) -> None:
    ((code, where, message),) = found(TASK + line + "\n")
    assert (code, where) == ("bad-value", f"pack.toml:7:{col}")
    assert message.startswith(f"{what} must be at most {MAX_DURATION_S} seconds (365 days), not ")


@pytest.mark.parametrize("edition", [1, 2, 3])
def test_the_timeout_bound_holds_in_every_edition(edition: int) -> None:
    text = TASK.replace("edition = 4", f"edition = {edition}") + "timeout = 1e10\n"
    ((code, _, message),) = found(text)
    assert code == "bad-value" and "at most 31536000 seconds" in message


def test_a_year_is_a_duration() -> None:
    assert (
        found(
            TASK
            + f"timeout = {MAX_DURATION_S}\nretry = {{ limit = 2, delay = {MAX_DURATION_S} }}\n"
        )
        == []
    )


def test_a_time_budget_past_a_year_is_refused_at_its_key() -> None:
    for value in ("1e12", "9007199254740991"):
        text = HEAD + TASKS + loop_text(time_budget=value)
        ((code, where, message),) = found(text)
        assert (code, where) == ("bad-value", f"pack.toml:{line_of(text, 'time_budget')}:1")
        assert "at most 31536000 (365 days)" in message


def test_a_huge_loop_number_is_not_called_infinite() -> None:
    # issue 27 item 21: "must be a finite number, not 1e+308"
    text = HEAD + TASKS + loop_text(target="1e308")
    ((code, _, message),) = found(text)
    assert code == "bad-value"
    assert message == "[loop] target must be within ±(2^53−1) = ±9007199254740991, not 1e+308"


MAP_OVER_MAPPED = """edition = {edition}
[workflow]
name = "m"
[[workflow.task]]
name = "src"
run = "true"
emits = {{ xs = "array" }}
[[workflow.task]]
name = "a"
needs = ["src"]
map = "src.xs"
run = "true"
emits = {{ v = "array" }}
[[workflow.task]]
name = "b"
needs = ["a"]
map = "a.v"
run = "true"
"""


@pytest.mark.parametrize("edition", [3, 4])
def test_a_map_over_a_mapped_task_is_refused_at_its_map(edition: int) -> None:
    # issue 27 item 18: validated and compiled, then failed at run time
    ((code, where, message),) = found(MAP_OVER_MAPPED.format(edition=edition))
    assert (code, where) == ("map-mapped-source", "pack.toml:17:1")
    assert message.startswith("map of task 'b' reads 'a.v', but 'a' is itself mapped")
