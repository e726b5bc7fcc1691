"""Issue 27's values that validate accepted and the run could not hold (items 6,
21): each refused at compile time, one diagnostic at its key, with words that
say what is wrong (docs/spec/manifest.md, "Durations")."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.compile._durations import MAX_DURATION_S
from crucible.compile._fanout import MAX_INSTANCES
from crucible.compile._manifest import analyze_manifest
from crucible.compile._matrix_rules import TooManyCombinations, matrix_combinations, matrix_size
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


@pytest.mark.parametrize("edition", [3])
def test_a_map_over_a_mapped_task_is_refused_at_its_map(edition: int) -> None:
    # issue 27 item 18: validated and compiled, then failed at run time; edition 4
    # defines it (issue 32 item 1: tests/compile/test_refs_compile.py)
    ((code, where, message),) = found(MAP_OVER_MAPPED.format(edition=edition))
    assert (code, where) == ("map-mapped-source", "pack.toml:17:1")
    assert message.startswith("map of task 'b' reads 'a.v', but 'a' is itself mapped")
    assert "edition 4" in message


def _naive(
    axes: list[tuple[str, list[Any]]], exclude: list[dict[str, Any]], include: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The matrix rules as written (combinations x entries): the reference."""
    from crucible.core import canon

    def matches(combo: dict[str, Any], entry: dict[str, Any]) -> bool:
        return all(canon.dumps(combo[k]) == canon.dumps(v) for k, v in entry.items() if k in combo)

    names = [n for n, _ in axes]
    out = [
        dict(zip(names, values, strict=True)) for values in itertools.product(*(v for _, v in axes))
    ]
    out = [c for c in out if not any(matches(c, e) for e in exclude)]
    originals = [dict(c) for c in out]
    added = []
    for entry in include:
        hit = False
        for combo, original in zip(out, originals, strict=True):
            if matches(original, entry):
                combo.update({k: v for k, v in entry.items() if k not in names})
                hit = True
        if not hit:
            added.append(dict(entry))
    return out + added


VALUES = [1, 2, "1", True, None, 1.5]


@settings(max_examples=200, deadline=None)
@given(
    a=st.lists(st.sampled_from(VALUES), min_size=1, max_size=4, unique_by=repr),
    b=st.lists(st.sampled_from(VALUES), min_size=1, max_size=3, unique_by=repr),
    exclude=st.lists(
        st.dictionaries(st.sampled_from(["a", "b"]), st.sampled_from(VALUES), min_size=1),
        max_size=4,
    ),
    include=st.lists(
        st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), st.sampled_from(VALUES)),
        max_size=4,
    ),
)
def test_linear_matching_gives_the_rules_result(
    a: list[Any], b: list[Any], exclude: list[dict[str, Any]], include: list[dict[str, Any]]
) -> None:
    # issue 27 item 19: the same combinations as matching every entry against every one
    axes = [("a", a), ("b", b)]
    got = matrix_combinations(axes, exclude, include, limit=MAX_INSTANCES)
    assert got == _naive(axes, exclude, include)


def test_a_static_matrix_past_the_bound_with_its_includes_is_refused() -> None:
    # was: validated, then failed at run time
    entries = ", ".join(f"{{ x = 3, n = {i} }}" for i in range(MAX_INSTANCES + 1))
    text = TASK + f"[workflow.task.matrix]\nx = [1, 2]\ninclude = [{entries}]\n"
    ((code, where, message),) = found(text)
    assert code == "fanout-too-large" and where is not None and where.startswith("pack.toml:7")
    assert message == (
        "matrix has 100,003 combinations with its include entries, more than 100,000"
    )


def test_a_static_matrix_whose_includes_match_stays_within_the_bound() -> None:
    entries = ", ".join(f"{{ x = {i}, n = {i} }}" for i in range(3))
    text = (
        TASK + f"[workflow.task.matrix]\nx = {{ count = {MAX_INSTANCES} }}\ninclude = [{entries}]\n"
    )
    assert found(text) == []


def test_the_bound_is_checked_once_the_product_is_over() -> None:
    with pytest.raises(TooManyCombinations) as info:
        matrix_size([("x", list(range(400))), ("y", list(range(400)))], limit=MAX_INSTANCES)
    assert info.value.count == 160_000


@pytest.mark.parametrize(
    "source", ["map = { end = 9007199254740993 }", "map = { count = 9007199254740993 }"]
)
def test_a_sequence_integer_out_of_range_says_so(source: str) -> None:
    # was: "end must be an integer, not integer"
    ((code, _, message),) = found(TASK + source + "\n")
    key = source.split("{ ")[1].split(" =")[0]
    assert code == "bad-value"
    assert (
        message == f"map: {key} must be within ±(2^53−1) = ±9007199254740991, not 9007199254740993"
    )


def test_a_deep_literal_map_is_refused_at_its_key() -> None:
    # was: "$: error: nesting deeper than 128 levels" with no file or line (exit 2)
    deep = "[" * 200 + "]" * 200
    ((code, where, message),) = found(TASK + f"map = {deep}\n")
    assert (code, where) == ("bad-value", "pack.toml:7:1")
    assert message == "map: items are nested deeper than 120 levels"


def test_a_default_deep_enough_to_break_the_plan_is_bad_default() -> None:
    # 128 levels passed the check, then the plan (4 levels more) could not be written
    deep = "[" * 128 + "]" * 128
    text = 'edition = 4\n[workflow]\nname = "x"\n[workflow.params.p]\ntype = "array"\n'
    ((code, where, _),) = found(text + f"default = {deep}\n" + TASK.split("\n", 3)[3])
    assert (code, where) == ("bad-default", "pack.toml:6:1")
