from __future__ import annotations

from typing import Any

import pytest

from crucible.compile import _params as params
from crucible.core.errors import InputRefused

PLAN: dict[str, Any] = {
    "workflow": {
        "name": "w",
        "params": {
            "who": {"type": "string", "default": "world"},
            "n": {"type": "integer"},
            "ratio": {"type": "number", "default": 0.5},
            "flag": {"type": "boolean", "default": False},
            "tags": {"type": "array", "default": []},
            "cfg": {"type": "object", "default": {}},
            "x": {"type": "any", "default": None},
        },
    }
}


def test_defaults_fill_in() -> None:
    assert params.check(PLAN, {"n": 3}) == {
        "who": "world",
        "n": 3,
        "ratio": 0.5,
        "flag": False,
        "tags": [],
        "cfg": {},
        "x": None,
    }


def test_supplied_values_win() -> None:
    got = params.check(PLAN, {"n": 1, "who": "me", "ratio": 2, "x": {"a": [1]}})
    assert got["who"] == "me" and got["ratio"] == 2 and got["x"] == {"a": [1]}


@pytest.mark.parametrize(
    ("supplied", "needle"),
    [
        ({}, "'n' is required"),
        ({"n": 1, "nope": 1}, "unknown param 'nope'"),
        ({"n": "3"}, "'n' must be a JSON integer"),
        ({"n": True}, "'n' must be a JSON integer"),
        ({"n": 1, "flag": 0}, "'flag'"),
        ({"n": 1, "ratio": float("nan")}, "'ratio'"),
        ({"n": 2**60}, "'n'"),
        ({"n": 1, "tags": {}}, "'tags'"),
    ],
)
def test_refusals_name_the_param(supplied: dict[str, Any], needle: str) -> None:
    with pytest.raises(InputRefused) as info:
        params.check(PLAN, supplied)
    assert needle in str(info.value)
    assert info.value.exit_code == 1


def test_coerce_from_command_line() -> None:
    assert params.coerce(PLAN, "who", "42") == "42"
    assert params.coerce(PLAN, "n", "42") == 42
    assert params.coerce(PLAN, "flag", "true") is True
    assert params.coerce(PLAN, "tags", '["a"]') == ["a"]
    assert params.coerce(PLAN, "x", "plain words") == "plain words"
    assert params.coerce(PLAN, "ratio", "1.5") == 1.5
    with pytest.raises(InputRefused):
        params.coerce(PLAN, "n", "x")
    with pytest.raises(InputRefused):
        params.coerce(PLAN, "n", "1.5")
    with pytest.raises(InputRefused):
        params.coerce(PLAN, "ghost", "1")
