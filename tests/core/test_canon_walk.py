"""canon's domain walk (``_fast_ok``) checks scalars inside containers where it
meets them: every refusal and every slow-path decision must still be made there,
at any depth, in dicts and in lists alike."""

from __future__ import annotations

import pytest

from crucible.core import canon


def _nest(leaf: object, depth: int, *, in_list: bool) -> object:
    value = leaf
    for _ in range(depth):
        value = [value, "s", 1, None, True] if in_list else {"k": value, "a": "s", "n": 1}
    return value


@pytest.mark.parametrize("in_list", [False, True])
@pytest.mark.parametrize("depth", [0, 1, 5])
@pytest.mark.parametrize(
    "leaf",
    [2**53, -(2**53), float("nan"), float("inf"), {1: "x"}, b"bytes", object(), {"s"}],
)
def test_nested_refusals_are_still_refused(leaf: object, depth: int, in_list: bool) -> None:
    with pytest.raises(canon.CanonError):
        canon.dumps(_nest(leaf, depth, in_list=in_list))


class _Int(int):
    pass


class _Str(str):
    pass


@pytest.mark.parametrize("leaf", [_Int(3), _Str("x")])
def test_subclasses_of_scalars_have_no_json_form(leaf: object) -> None:
    for value in (leaf, [leaf], {"k": leaf}):
        with pytest.raises(canon.CanonError, match="no JSON form"):
            canon.dumps(value)


@pytest.mark.parametrize("in_list", [False, True])
def test_a_high_key_or_a_float_anywhere_takes_the_slow_path(in_list: bool) -> None:
    assert canon._fast_ok(_nest({"plain": 1}, 4, in_list=in_list), "$") is True
    assert canon._fast_ok(_nest({"\ue000": 1}, 4, in_list=in_list), "$") is False
    assert canon._fast_ok(_nest({"é": 1}, 4, in_list=in_list), "$") is True  # below U+E000
    assert canon._fast_ok(_nest(1e21, 4, in_list=in_list), "$") is False
    high = _nest({"\ue000": 1, "a": 2}, 3, in_list=in_list)
    assert canon.dumps(high) == canon._dumps_slow(high, "$").encode()


def test_bounds_inside_containers_are_accepted() -> None:
    value = {"max": 2**53 - 1, "min": -(2**53 - 1), "l": [2**53 - 1, False, None]}
    assert canon.loads(canon.dumps(value)) == value


def test_the_depth_bound_applies_inside_lists_and_dicts() -> None:
    for in_list in (False, True):
        canon.dumps(_nest(1, canon.MAX_DEPTH, in_list=in_list))
        with pytest.raises(canon.CanonError, match="nesting deeper"):
            canon.dumps(_nest([1], canon.MAX_DEPTH, in_list=in_list))
