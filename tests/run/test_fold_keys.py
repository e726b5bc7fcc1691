"""A fold keeps keys ``"0"`` .. ``"n-1"`` (a map over an array) as numbers
(crucible.run.report._fold._NumberedKeys, 16 bytes an instance) and any other
key as a string: both give the same slots, keys, figures and outliers, and a
fold of numbered keys that meets another key turns into one of strings without
losing an instance."""

from __future__ import annotations

import pytest

from crucible.run.report._fold import Folded, _Keys, _NumberedKeys
from crucible.run.report._report import _Numbers

N = 50


def _fill(folded: Folded, keys: list[str]) -> None:
    for n, key in enumerate(keys):
        usage = None if n % 7 == 0 else (n * 0.01, 50.0, None, 1000 + n, n % 3 == 0, n, 2 * n, 1, 2)
        folded.add(
            key,
            1 + n % 2,
            100.0 + n,
            100.5 + n * 1.5,
            (n * 37) % 11 * 0.1,
            n,
            None,
            n % 5 == 0,
            usage,
        )


def _seen(folded: Folded) -> tuple[object, ...]:
    return (
        len(folded),
        folded.outliers(),
        folded.totals(),
        folded.measured(),
        [
            folded.figure(name, measured=m)
            for name in ("duration", "cpu_s", "io")
            for m in (False, True)
        ],
        list(folded.starts()),
        folded.timed(),
        folded.cached_count(),
    )


ORDER = [str((n * 13) % N) for n in range(N)]  # folded out of item order, as -j N does


def test_numbered_and_string_keys_fold_alike() -> None:
    numbered, strings = Folded("t", numbered=N), Folded("t")
    assert isinstance(numbered.slots, _NumberedKeys) and isinstance(strings.slots, _Keys)
    _fill(numbered, ORDER)
    _fill(strings, ORDER)
    assert _seen(numbered) == _seen(strings)
    for key in ("3", "40"):
        assert numbered.take(key) == strings.take(key)
        assert key not in numbered and numbered.slot(key) is None
    assert _seen(numbered) == _seen(strings)
    assert all((k in numbered) == (k in strings) for k in [*ORDER, "x", "007", str(N), "-1"])


@pytest.mark.parametrize(
    "odd", ["007", "x", str(N), "\u0663", "+1", " 1", "1_0", "-0"]
)  # "٣": a digit, not ASCII
def test_a_key_that_is_no_number_turns_the_fold_to_strings(odd: str) -> None:
    numbered, strings = Folded("t", numbered=N), Folded("t")
    keys = [*ORDER[:20], odd, *ORDER[20:]]
    _fill(numbered, keys[:10])
    numbered.take(ORDER[3])
    _fill(numbered, keys[10:])
    _fill(strings, keys[:10])
    strings.take(ORDER[3])
    _fill(strings, keys[10:])
    assert isinstance(numbered.slots, _Keys)
    assert odd in numbered and ORDER[3] not in numbered
    assert _seen(numbered) == _seen(strings)


def test_numbered_item_keys_read_as_the_list_of_strings() -> None:
    strings = [str(n) for n in range(N)]
    numbers = _Numbers(N)
    assert len(numbers) == N and list(numbers) == strings
    assert [numbers[i] for i in (0, 7, -1)] == [strings[i] for i in (0, 7, -1)]
    assert numbers[3:9] == strings[3:9] and "12" in numbers and "x" not in numbers
    with pytest.raises(IndexError):
        numbers[N]
