from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crucible.core import canon, digest
from crucible.core.canon import CanonError


def _vector_names(shared: Path) -> list[str]:
    return sorted(p.stem for p in (shared / "vectors/jcs/input").glob("*.json"))


def test_jcs_reference_vectors(shared_dir: Path) -> None:
    names = _vector_names(shared_dir)
    assert len(names) >= 6
    for name in names:
        raw = (shared_dir / f"vectors/jcs/input/{name}.json").read_bytes()
        expected = (shared_dir / f"vectors/jcs/output/{name}.json").read_bytes()
        value = canon.loads(raw)
        assert canon.dumps(value) == expected, name
        hexed = (shared_dir / f"vectors/jcs/outhex/{name}.txt").read_text().split()
        assert bytes(int(h, 16) for h in hexed) == expected


def test_es6_numbers(shared_dir: Path) -> None:
    lines = (
        (shared_dir / "vectors/jcs/es6numbers/es6testfile_first10000.txt").read_text().splitlines()
    )
    assert len(lines) == 10000
    for line in lines:
        hex_bits, expected = line.split(",")
        (x,) = struct.unpack(">d", int(hex_bits, 16).to_bytes(8, "big"))
        assert canon.es6_number(x) == expected, line
        if abs(x) > canon.MAX_SAFE_INTEGER and "e" not in expected and "." not in expected:
            with pytest.raises(CanonError):  # would print as an out-of-range integer
                canon.dumps([x])
        else:
            assert canon.dumps([x]) == f"[{expected}]".encode()


@pytest.mark.parametrize(
    "text",
    [
        b'{"a":1,"a":2}',
        b'{"x":{"a":1,"a":1}}',
        b"[NaN]",
        b"[Infinity]",
        b"[-Infinity]",
        b'"\\ud800"',
        b'"\\udc00x"',
        b"9007199254740992",
        b"-9007199254740992",
        b"1e400",
        b"\xff",
        b"[1,]",
        b"",
    ],
)
def test_loads_refuses(text: bytes) -> None:
    with pytest.raises(CanonError) as info:
        canon.loads(text)
    assert info.value.exit_code == 2
    assert str(info.value)


def test_loads_accepts_bounds() -> None:
    assert canon.loads(b"[9007199254740991,-9007199254740991]") == [2**53 - 1, -(2**53 - 1)]
    assert canon.loads('{"é":"\\ud83d\\ude00"}') == {"é": "😀"}


@pytest.mark.parametrize(
    "value",
    [
        2**53,
        -(2**53),
        2.0**53,
        -1e20,
        math.nan,
        math.inf,
        {1: 2},
        {"a": object()},
        "\ud800",
        {"\udfff": 1},
        b"x",
        {1.5},
    ],
)
def test_dumps_refuses(value: object) -> None:
    with pytest.raises(CanonError):
        canon.dumps(value)


def test_key_order_is_utf16() -> None:
    # U+E000 sorts after a supplementary char in UTF-16 (D83D < E000), before it by code point.
    assert canon.dumps({"\ue000": 1, "😀": 2, "a": 3}) == '{"a":3,"😀":2,"\ue000":1}'.encode()


def test_escaping() -> None:
    assert canon.dumps('\x00\x08\t\n\x0c\r\x1f\x7f"\\/\u2028') == (
        b'"\\u0000\\b\\t\\n\\f\\r\\u001f\x7f\\"\\\\/\xe2\x80\xa8"'
    )


def test_negative_zero_and_integral_floats() -> None:
    assert canon.dumps([-0.0, 1.0, 1e21, 1e-7, 4.5]) == (b"[0,1,1e+21,1e-7,4.5]")


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda x: abs(x) <= canon.MAX_SAFE_INTEGER or abs(x) >= 1e21 or not x.is_integer()
    )
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)


@given(json_values)
def test_round_trip_and_idempotent(value: object) -> None:
    data = canon.dumps(value)
    back = canon.loads(data)
    assert canon.dumps(back) == data
    # stdlib agrees on the value (floats compare by value; -0.0 becomes 0)
    assert json.loads(data) == back


@given(json_values)
def test_fast_and_slow_paths_agree(value: object) -> None:
    assert canon.dumps(value) == canon._dumps_slow(value, "$").encode()


@settings(max_examples=2000)
@given(
    (
        st.floats(min_value=1e-5, max_value=1e17) | st.floats(min_value=-1e17, max_value=-1e-5)
    ).filter(lambda x: not x.is_integer()),
    st.integers(0, 9),
)
def test_floats_on_the_fast_path_print_as_es6(x: float, places: int) -> None:
    """Non-integral floats where repr has no exponent go through orjson; they must
    print exactly as ES6 does (the pure-Python path), rounded ones included."""
    r = round(x, places)
    if r.is_integer() and abs(r) > canon.MAX_SAFE_INTEGER:
        r = x  # outside the domain either way (refused by both paths)
    for v in (x, r, [x, {"d": r}]):
        assert canon.dumps(v) == canon._dumps_slow(v, "$").encode()
    assert canon.dumps({"duration": 0.012345}) == b'{"duration":0.012345}'


@given(st.dictionaries(st.text(), st.integers(-5, 5), max_size=8))
def test_key_permutation_invariant(d: dict[str, int]) -> None:
    reversed_d = dict(reversed(list(d.items())))
    assert canon.dumps(d) == canon.dumps(reversed_d)
    assert digest.of_json(d) == digest.of_json(reversed_d)


def test_digest_forms(tmp_path: Path) -> None:
    assert (
        digest.of_bytes(b"")
        == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert digest.of_json({"b": 1, "a": 2}) == digest.of_bytes(b'{"a":2,"b":1}')
    p = tmp_path / "f"
    p.write_bytes(b"abc" * 1000)
    assert digest.of_file(p) == digest.of_bytes(b"abc" * 1000)
    assert digest.is_digest(digest.of_bytes(b"x"))
    assert not digest.is_digest("sha256:XYZ")


def test_depth_bound_is_the_same_both_ways() -> None:
    deep: object = 1
    for _ in range(canon.MAX_DEPTH):
        deep = [deep]
    data = canon.dumps(deep)
    assert canon.loads(data) == deep
    with pytest.raises(CanonError, match="nesting deeper"):
        canon.dumps([deep])
    with pytest.raises(CanonError, match="nesting deeper"):
        canon.loads(b"[" + data + b"]")
    with pytest.raises(CanonError, match="nesting deeper"):
        canon.loads(b'{"a":' * 5000 + b"1" + b"}" * 5000)
    # brackets inside strings do not count
    assert canon.loads(b'["' + b"[" * 500 + b'"]') == ["[" * 500]
    assert canon.loads(b'["\\\\", "\\"[[["]') == ["\\", '"[[[']


def _strict_loads(data: bytes) -> object:
    """canon.loads with its canonical fast path turned off (the strict pass only)."""
    saved = canon._loads_canonical
    canon._loads_canonical = lambda _data: canon._NOT_CANONICAL  # type: ignore[assignment]
    try:
        return canon.loads(data)
    finally:
        canon._loads_canonical = saved  # type: ignore[assignment]


@settings(max_examples=500)
@given(json_values, st.sampled_from([b"", b"\n", b"\n\n", b" "]))
def test_the_canonical_fast_path_reads_what_the_strict_pass_reads(
    value: object, tail: bytes
) -> None:
    """A text crucible wrote (canonical, maybe one newline after it) is read by
    the fast path; whatever it returns, the strict pass returns too, and a
    text it declines is left to the strict pass."""
    data = canon.dumps(value) + tail
    fast = canon._loads_canonical(data)
    if tail in (b"", b"\n") and canon._fast_ok(value, "$"):  # orjson writes it as JCS
        assert fast is not canon._NOT_CANONICAL
    if fast is not canon._NOT_CANONICAL:
        assert canon.dumps(fast) == canon.dumps(_strict_loads(data))
    assert canon.dumps(canon.loads(data)) == canon.dumps(_strict_loads(data))


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.integers(-3, 3), min_size=1, max_size=5))
def test_a_duplicate_key_in_canonical_text_is_refused(d: dict[str, int]) -> None:
    """The text stays sorted, compact and escaped as canonical JSON would be,
    with its first member written twice: orjson would keep one silently."""
    data = canon.dumps(d)
    first = canon.dumps(dict([next(iter(sorted(d.items(), key=lambda kv: canon.dumps(kv[0]))))]))
    member = first[1:-1]
    doubled = b"{" + member + b"," + data[1:]
    with pytest.raises(CanonError, match="duplicate"):
        canon.loads(doubled)
