"""canon.loads refuses nesting past MAX_DEPTH from the text, before parsing, and
counts no bracket that stands inside a string (the scan runs in C: core/canon.py)."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from crucible.core import canon
from crucible.core.canon import MAX_DEPTH, CanonError


def _nested(depth: int, opener: str = "[") -> bytes:
    closer = {"[": "]", "{": "}"}[opener]
    if opener == "[":
        return (b"[" * depth) + (b"]" * depth)
    inner = b"1"
    for _ in range(depth):
        inner = b'{"k":' + inner + closer.encode()
    return inner


@pytest.mark.parametrize("opener", ["[", "{"])
def test_the_limit_is_exact(opener: str) -> None:
    canon.loads(_nested(MAX_DEPTH, opener))
    with pytest.raises(CanonError, match=f"nesting deeper than {MAX_DEPTH} levels"):
        canon.loads(_nested(MAX_DEPTH + 1, opener))


def test_brackets_inside_strings_do_not_count() -> None:
    noise = '"' + "[{" * 300 + '\\"[[[' + "}]" * 10 + '"'
    doc = f"[{noise}," * 100 + "1" + "]" * 100
    assert len(canon.loads(doc.encode())) == 2


_values = st.recursive(
    st.none() | st.integers(-1000, 1000) | st.text(alphabet='[]{}"\\ab', max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet="[{k", max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


def _depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


@given(_values, st.integers(-1, 1))
def test_the_scan_agrees_with_the_parsed_depth(value: object, past: int) -> None:
    # wrap the value in arrays until its depth is MAX_DEPTH + past
    wraps = max(0, MAX_DEPTH + past - _depth(value))
    text = b"[" * wraps + orjson.dumps(value) + b"]" * wraps
    if _depth(value) + wraps > MAX_DEPTH:
        with pytest.raises(CanonError, match="nesting deeper"):
            canon.loads(text)
    else:
        assert canon.loads(text) is not None
