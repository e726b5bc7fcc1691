from __future__ import annotations

import pytest

from crucible.core.errors import InputRefused
from crucible.stage import KEY_COMPONENT_MAX, StateLayout, escape_key, unescape_key
from crucible.stage._names import check_task_name, is_shortened, task_name_problem


@pytest.mark.parametrize(
    ("key", "escaped"),
    [
        ("abc-DEF_09", "abc-DEF_09"),
        ("", "%"),
        (".", "%2E"),
        ("..", "%2E%2E"),
        (".hidden", "%2Ehidden"),
        ("a/../../x", "a%2F%2E%2E%2F%2E%2E%2Fx"),
        ("%2e%2e", "%252e%252e"),
        ("a\x00b", "a%00b"),
        ("back\\slash", "back%5Cslash"),
        ("é", "%C3%A9"),
        ("a b", "a%20b"),
        ("~", "%7E"),
        ("\ud800", "%ED%A0%80"),  # a lone surrogate (never from JSON) still round-trips
    ],
)
def test_escape_examples(key: str, escaped: str) -> None:
    assert escape_key(key) == escaped
    assert unescape_key(escaped) == key


def test_long_key_is_shortened_with_digest_and_stays_distinct() -> None:
    a = "x" * 1000
    b = "x" * 999 + "y"
    ea, eb = escape_key(a), escape_key(b)
    assert len(ea.encode()) <= KEY_COMPONENT_MAX and len(eb) <= KEY_COMPONENT_MAX
    assert ea != eb
    assert is_shortened(ea)
    with pytest.raises(InputRefused, match="shortened"):
        unescape_key(ea)


def test_long_multibyte_key_prefix_never_splits_an_escape() -> None:
    key = "é" * 200  # 6 escaped chars each
    e = escape_key(key)
    prefix = e.split("~")[0]
    assert len(prefix) % 3 == 0 and set(prefix[::3]) == {"%"}


def test_key_of_exactly_the_limit_is_not_shortened() -> None:
    key = "k" * KEY_COMPONENT_MAX
    assert escape_key(key) == key
    assert is_shortened(escape_key(key + "k"))


@pytest.mark.parametrize("bad", ["%2e", "%2", "%zz", "%41", "a.b", "a/b", "é"])
def test_unescape_refuses_what_escape_never_produces(bad: str) -> None:
    with pytest.raises(InputRefused):
        unescape_key(bad)


@pytest.mark.parametrize(
    "name", ["", ".", "..", "a/b", "/abs", "a\\b", "@values", "t[0]", "x]", "a\x00", "n" * 250]
)
def test_task_name_refused(name: str) -> None:
    assert task_name_problem(name) is not None
    with pytest.raises(InputRefused):
        check_task_name(name)


@pytest.mark.parametrize("name", ["build", "a.b", ".hidden", "a@b", "tâche", "-x", "n" * 249])
def test_task_name_accepted(name: str) -> None:
    assert check_task_name(name) == name


def test_layout_paths(tmp_path) -> None:  # type: ignore[no-untyped-def]
    layout = StateLayout(tmp_path)
    assert layout.result_path("t") == tmp_path / "results" / "t.json"
    assert layout.result_path("t", "a/b") == tmp_path / "results" / "t.jsonl"  # packed
    assert layout.files_dir("t") == tmp_path / "files" / "t"
    assert layout.files_dir("t", "..") == tmp_path / "files" / "t" / "%2E%2E"
    assert layout.work_dir("t", "") == tmp_path / "work" / "t" / "%"
    with pytest.raises(InputRefused):
        layout.result_path("..")
    with pytest.raises(InputRefused):
        layout.files_dir("/etc")
