"""crucible.core.refs: the one reference parser (producer.field[path])."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crucible.core.refs import Ref, RefMissing, RefSyntax, parse_ref, resolve_path


def test_plain_ref_splits_at_the_last_dot_without_task_names() -> None:
    assert parse_ref("a.b.c") == Ref("a.b", "c")
    assert parse_ref("gen.items") == Ref("gen", "items")


def test_element_and_member_paths() -> None:
    assert parse_ref("a.items[0]") == Ref("a", "items", (0,))
    assert parse_ref("a.rows[2].name", {"a"}) == Ref("a", "rows", (2, "name"))
    assert parse_ref("a.config.region", {"a"}) == Ref("a", "config", ("region",))
    assert parse_ref("a.m[1][0]") == Ref("a", "m", (1, 0))


def test_the_longest_task_name_wins() -> None:
    # "a.config" is a task too: the reference keeps its edition-3 meaning
    assert parse_ref("a.config.region", {"a", "a.config"}) == Ref("a.config", "region")
    assert parse_ref("x.y.f.g", {"x", "x.y"}) == Ref("x.y", "f", ("g",))


@pytest.mark.parametrize(
    "text",
    [
        "",
        "a",
        ".f",
        "a.",
        "a.items[",
        "a.items[-1]",
        "a.items[01]",
        "a.items[x]",
        "a.9f",
        "a.items[0]x",
        "a.items[0].",
        "a.items[0].9",
        "a.b c",
    ],
)
def test_malformed_refs_are_refused(text: str) -> None:
    with pytest.raises(RefSyntax):
        parse_ref(text)


def test_resolve_names_the_missing_step() -> None:
    ref = parse_ref("a.items[3]")
    with pytest.raises(RefMissing, match=r"^a\.items\[3\]: index out of range \(2 items\)$"):
        ref.at(["x", "y"])
    with pytest.raises(RefMissing, match=r"a\.config\.region: no member 'region'"):
        parse_ref("a.config.region", {"a"}).at({"zone": 1})
    with pytest.raises(RefMissing, match=r"a\.v\[0\]: not an array \(object\)"):
        resolve_path({"k": 1}, (0,), "a.v")
    assert parse_ref("a.rows[1].name", {"a"}).at([{}, {"name": "n"}]) == "n"


_ident = st.from_regex(r"\A[A-Za-z_][A-Za-z0-9_-]{0,8}\Z")
_step = st.one_of(st.integers(0, 10**6), _ident)


@given(
    st.lists(_ident, min_size=1, max_size=3).map(".".join),
    _ident,
    st.lists(_step, max_size=5),
)
def test_text_round_trips(producer: str, field: str, path: list[int | str]) -> None:
    ref = Ref(producer, field, tuple(path))
    assert parse_ref(ref.text, {producer}) == ref


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_ident, inner, max_size=4),
    max_leaves=20,
)


@given(_json, st.lists(st.integers(0, 5) | _ident, max_size=4))
def test_resolve_walks_or_names_the_step_that_missed(value: object, path: list[int | str]) -> None:
    # the naive walk: where it stops, resolve must say so at that step
    cur: object = value
    for i, step in enumerate(path):
        ok = (isinstance(step, int) and isinstance(cur, list) and step < len(cur)) or (
            isinstance(step, str) and isinstance(cur, dict) and step in cur
        )
        if not ok:
            with pytest.raises(RefMissing) as missed:
                resolve_path(value, path, "a.v")
            shown = Ref("a", "v", tuple(path[: i + 1])).text
            assert missed.value.message.startswith(f"{shown}: ")
            return
        cur = cur[step]  # type: ignore[index]
    assert resolve_path(value, path, "a.v") == cur
