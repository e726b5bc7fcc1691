"""Canonical JSON: RFC 8785 (JCS) bytes, and a strict parser.

Domain (our choice, docs/spec/canonical-json.md): null, booleans, strings
without lone surrogates, integers within ±(2^53−1), finite doubles (serialized
as ECMAScript ``Number.prototype.toString``), arrays (lists or tuples) and
objects with string keys. Anything else is refused with :class:`CanonError`,
never silently changed.

orjson is the fast path: its bytes equal JCS when the value holds no float and
no object key with a code point at or above U+E000 (orjson sorts keys by code
point, JCS by UTF-16 code unit; the two orders differ only there). One Python
walk decides which path to take; the slow path is exact for the whole domain.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import orjson

from crucible.core.errors import Location, ParseError

__all__ = ["MAX_DEPTH", "MAX_SAFE_INTEGER", "CanonError", "dumps", "dumps_str", "loads"]

MAX_SAFE_INTEGER = 2**53 - 1
#: deepest nesting of arrays/objects in the canonical domain (our choice: within
#: orjson's 255 and far from Python's recursion limit, so whatever loads() accepts
#: dumps() writes back)
MAX_DEPTH = 128

_encode_string: Callable[[str], str] = json.encoder.encode_basestring  # type: ignore[attr-defined]


class CanonError(ParseError):
    """A value outside the canonical domain, or JSON text the strict parser refuses.

    ``valid_json``: the text is JSON (RFC 8259's grammar) that crucible's domain
    refuses (an integer past ±(2^53−1), a number past a double, a duplicate key,
    nesting past MAX_DEPTH), so a reader says "holds a value crucible does not
    accept", never "is not valid JSON"."""

    code = "canonical-json"
    valid_json = False


class _OutsideDomain(CanonError):
    """Valid JSON outside crucible's domain (see :class:`CanonError`)."""

    valid_json = True


def _has_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _fast_ok(value: Any, path: str) -> bool:
    """Check the domain; True when orjson's output equals JCS for this value.

    Every event, record and cache key passes here, so the walk is kept lean:
    strings, null, booleans and in-range integers inside a container are
    checked where they are met, never pushed; an ASCII key (nearly all of them)
    is cleared by ``str.isascii`` before any ``max``."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    push = stack.append
    pop = stack.pop
    fast = True
    while stack:
        v, depth = pop()
        t = type(v)
        if t is dict or t is list or t is tuple:
            if depth >= MAX_DEPTH:
                raise CanonError(f"nesting deeper than {MAX_DEPTH} levels", location=Location(path=path))
            inner = depth + 1
            items = v
            if t is dict:
                for k in v:
                    if type(k) is not str:
                        raise CanonError(f"object key {k!r} is not a string", location=Location(path=path))
                    if fast and k and not k.isascii() and max(k) >= "\ue000":
                        fast = False
                items = v.values()
            for item in items:
                ti = type(item)
                if ti is str or item is None or ti is bool:
                    continue
                if ti is int and -MAX_SAFE_INTEGER <= item <= MAX_SAFE_INTEGER:
                    continue
                push((item, inner))
            continue
        if t is str or v is None or t is bool:
            continue  # lone surrogates: orjson refuses them; the slow path checks
        if t is int:
            if not -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
                raise CanonError(f"integer {v} is outside ±(2^53−1)", location=Location(path=path))
            continue
        if t is float:
            if not math.isfinite(v):
                raise CanonError(f"number {v!r} is not finite", location=Location(path=path))
            if fast and not _plain_float(v):
                fast = False
            continue
        raise CanonError(f"value of type {t.__name__} has no JSON form", location=Location(path=path))
    return fast


def _plain_float(x: float) -> bool:
    """True when orjson writes ``x`` exactly as ES6 does (checked at import).

    Both print the shortest digits that round-trip; they differ only in when
    they switch to exponent notation and in how they print integral values
    (``2.0`` against ES6's ``2``). Where Python's own ``repr`` uses neither an
    exponent nor a trailing ``.0`` (1e-4 <= |x| < 1e16, not integral), all three
    agree: such a float may take the fast path (durations, ratios, sizes in
    MiB: the floats a run's events and records carry)."""
    r = repr(x)
    return _ORJSON_PLAIN_FLOATS and "e" not in r and not r.endswith(".0")


def dumps(value: Any) -> bytes:
    """The RFC 8785 canonical bytes of ``value`` (UTF-8, no trailing newline)."""
    if _fast_ok(value, "$"):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except TypeError as exc:  # lone surrogate in a string
            raise CanonError(f"not canonical JSON: {exc}") from None
    return _dumps_slow(value, "$").encode("utf-8")


def dumps_str(value: Any) -> str:
    return dumps(value).decode("utf-8")


def _utf16_key(k: str) -> bytes:
    return k.encode("utf-16-be", "surrogatepass")


def _string(s: str, path: str) -> str:
    if _has_surrogate(s):
        raise CanonError("string holds a lone surrogate", location=Location(path=path))
    return _encode_string(s)


def _dumps_slow(v: Any, path: str) -> str:
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    t = type(v)
    if t is str:
        return _string(v, path)
    if t is int:
        if not -MAX_SAFE_INTEGER <= v <= MAX_SAFE_INTEGER:
            raise CanonError(f"integer {v} is outside ±(2^53−1)", location=Location(path=path))
        return str(v)
    if t is float:
        return _float(v, path)
    if t is list or t is tuple:
        return "[" + ",".join(_dumps_slow(x, path) for x in v) + "]"
    if t is dict:
        for k in v:
            if type(k) is not str:
                raise CanonError(f"object key {k!r} is not a string", location=Location(path=path))
            if _has_surrogate(k):
                raise CanonError("object key holds a lone surrogate", location=Location(path=path))
        keys = sorted(v, key=_utf16_key)
        return "{" + ",".join(_encode_string(k) + ":" + _dumps_slow(v[k], path) for k in keys) + "}"
    raise CanonError(f"value of type {t.__name__} has no JSON form", location=Location(path=path))


def _float(x: float, path: str) -> str:
    text = es6_number(x)
    # An integral double in [2^53, 1e21) prints as a bare integer literal that
    # loads() must refuse; keep the domain closed under dumps -> loads.
    if abs(x) > MAX_SAFE_INTEGER and "e" not in text and "." not in text:
        raise CanonError(f"number {text} prints as an integer outside ±(2^53−1)", location=Location(path=path))
    return text


def es6_number(x: float) -> str:
    """ECMAScript ``Number.prototype.toString`` of a finite double (RFC 8785 §3.2.2.3)."""
    if not math.isfinite(x):
        raise CanonError(f"number {x!r} is not finite")
    if x == 0:
        return "0"
    r = repr(x)  # shortest round-trip digits, as ECMAScript requires
    sign = ""
    if r[0] == "-":
        sign, r = "-", r[1:]
    mantissa, _, exp_text = r.partition("e")
    exponent = int(exp_text) if exp_text else 0
    int_part, _, frac_part = mantissa.partition(".")
    all_digits = (int_part + frac_part).lstrip("0")
    digits = all_digits.rstrip("0")
    k = len(digits)
    # value = digits * 10^(n - k)
    n = exponent - len(frac_part) + (len(all_digits) - k) + k
    if k <= n <= 21:
        out = digits + "0" * (n - k)
    elif 0 < n <= 21:
        out = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        out = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        e_text = ("+" if e >= 0 else "-") + str(abs(e))
        out = (digits if k == 1 else digits[0] + "." + digits[1:]) + "e" + e_text
    return sign + out


def _refuse_constant(name: str) -> Any:
    raise CanonError(f"{name} is not a JSON number")


def _parse_int(text: str) -> int:
    value = int(text)
    if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
        raise _OutsideDomain(f"integer {text} is outside ±(2^53−1)")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutsideDomain(f"number {text} overflows a double")
    return value


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _OutsideDomain(f"duplicate object key {k!r}")
            seen.add(k)
    return obj


def loads(data: bytes | str) -> Any:
    """Parse JSON strictly.

    Refused (:class:`CanonError`, exit 2): syntax errors, invalid UTF-8, duplicate
    keys, NaN/Infinity, lone surrogates, integer literals outside ±(2^53−1), and
    numbers that overflow a double. Messages give line and column where known.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    canonical = _loads_canonical(data)
    if canonical is not _NOT_CANONICAL:
        return canonical
    if data.count(b"[") + data.count(b"{") > MAX_DEPTH:
        _check_depth_text(data)
    # orjson refuses bad UTF-8, lone surrogate escapes, NaN and overflow fast;
    # the stdlib pass then catches what orjson accepts silently (duplicate keys,
    # out-of-range integers).
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            # the message compile gives for a manifest, not orjson's "str is not
            # valid UTF-8: surrogates not allowed"
            raise CanonError(f"not UTF-8 (byte {bad.start})") from None
        if _is_json(data):  # orjson refuses 1e400 and lone surrogates: valid JSON
            raise _OutsideDomain(str(exc)) from None
        raise CanonError(f"invalid JSON: {exc}") from None
    try:
        return json.loads(
            data,
            object_pairs_hook=_pairs,
            parse_constant=_refuse_constant,
            parse_int=_parse_int,
            parse_float=_parse_float,
        )
    except json.JSONDecodeError as exc:
        raise CanonError(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise _OutsideDomain(f"nesting deeper than {MAX_DEPTH} levels") from None


_NOT_CANONICAL: Any = object()


def _loads_canonical(data: bytes) -> Any:
    """The value of ``data`` when it is canonical JSON (optionally followed by
    one newline, as crucible writes its files), else ``_NOT_CANONICAL`` and the
    strict pass decides.

    Most texts crucible reads are ones it wrote canonically: a plan, a
    record, a params file. For those, orjson's parse, the domain walk and one
    re-serialization that gives back exactly ``data`` prove everything the
    strict pass checks: a duplicate key would have been dropped (the bytes
    would differ), an integer past ±(2^53−1) or nesting past MAX_DEPTH fails
    the walk, a non-finite or lone-surrogate text fails orjson. 1.2 ms instead
    of 5.6 for a 1,000-task plan (the strict pass is ``json`` with hooks)."""
    end = len(data) - 1 if data[-1:] == b"\n" else len(data)
    try:
        value = orjson.loads(data)
        if not _fast_ok(value, "$"):
            return _NOT_CANONICAL
        again = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except (orjson.JSONDecodeError, CanonError, TypeError):
        return _NOT_CANONICAL
    if len(again) != end or data[:end] != again:
        return _NOT_CANONICAL
    return value


def _is_json(data: bytes) -> bool:
    """Is ``data`` JSON by RFC 8259's grammar (numbers of any size, any escapes)?
    Asked only of a text orjson refused, to word the refusal."""
    try:
        json.loads(data, parse_constant=_refuse_constant, parse_float=str, parse_int=str)
    except (ValueError, RecursionError, CanonError):
        return False
    return True


#: a JSON string token (escapes skipped), the loop unrolled: the same matches as
#: ``"(?:[^"\\]|\\.)*"`` (a backslash always takes the next byte, so each start
#: has one match or none) in half the time (4.3 -> 1.9 ms over a 1,000-task plan)
_STRING_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
#: every byte but the four brackets, deleted by bytes.translate
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
#: a bracket's step in depth, indexed by its byte
_DEPTH_STEP = [0] * 256
_DEPTH_STEP[ord("[")] = _DEPTH_STEP[ord("{")] = 1
_DEPTH_STEP[ord("]")] = _DEPTH_STEP[ord("}")] = -1


def _check_depth_text(data: bytes) -> None:
    """Refuse nesting deeper than MAX_DEPTH before parsing (strings skipped).

    The scan runs in C (regex, translate, accumulate): a Python loop over every
    bracket was half of loading a 1,000-task plan."""
    brackets = _STRING_TOKENS.sub(b"", data).translate(None, _NOT_BRACKETS)
    if brackets and max(accumulate(map(_DEPTH_STEP.__getitem__, brackets))) > MAX_DEPTH:
        raise _OutsideDomain(f"nesting deeper than {MAX_DEPTH} levels")


#: orjson's float output checked once against ES6 on values spanning the fast
#: path's range; an orjson that printed them differently keeps every float on
#: the pure-Python path.
_ORJSON_PLAIN_FLOATS = all(
    orjson.dumps(x) == es6_number(x).encode()
    for x in (0.0001, 0.00012345678901234, 0.1, 0.5, 1 / 3, 123.456, -7.25, 1234567890123456.7)
)
