"""Sequence sources (Argo's ``withSequence``), edition 4: ``map = { start, end,
step, format }`` or ``{ count, start, step, format }``, where ``count``,
``start`` and ``end`` may read an integer param (``"params.n"``).

One module for the three places a sequence is read: the compiler checks one
and writes its plan form (:func:`check_sequence`, :func:`check_sequence_params`),
the dispatcher expands it with the run's params (:func:`sequence_values`,
:func:`check_sequence_param_values`), and the strict plan reader turns a plan
form back into manifest spelling (:func:`sequence_to_manifest`).
docs/spec/manifest.md "Fan-out" is the contract.

Plan form (docs/spec/plan-ir.md): ``{"sequence": {"count", "start", "step",
"format"?}}`` when every bound is a number (``end`` turned into ``count``, as
before this module); when a bound reads a param, the bound the manifest wrote
(``count`` or ``end``) is kept, as ``{"param": NAME}``, ``start`` and ``step``
written out. ``step`` is always a literal (its sign says which way to count).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from crucible.compile._checker import Checker
from crucible.compile._diagnostics import KeyPath
from crucible.compile._names import ident_problem
from crucible.core.canon import MAX_SAFE_INTEGER

__all__ = [
    "MAX_FORMAT_WIDTH",
    "SEQUENCE_KEYS",
    "SequenceProblem",
    "check_sequence",
    "check_sequence_param_values",
    "check_sequence_params",
    "describe_sequence",
    "format_problem",
    "sequence_params",
    "sequence_size",
    "sequence_to_manifest",
    "sequence_values",
]

SEQUENCE_KEYS: tuple[str, ...] = ("count", "start", "end", "step", "format")
#: the keys that may read a param (``step`` stays literal: it fixes the direction)
_PARAM_KEYS = ("count", "start", "end")
#: widest field a format may ask for (our choice: "%0100000d" would make each item
#: 100 KB; a zero-padded 64-bit number needs 20)
MAX_FORMAT_WIDTH = 64
#: longest format string (a format is a name pattern, not a document)
MAX_FORMAT = 256
#: one printf conversion: flags, width, precision, type (Python's %-format, which
#: for integers agrees with C's and Go's)
_CONVERSION = re.compile(r"%(?P<flags>[-+ 0#]*)(?P<width>\d*)(?:\.(?P<prec>\d*))?(?P<type>.?)")
_INTEGER_TYPES = "diouxX"


class SequenceProblem(ValueError):
    """A sequence that cannot be expanded with the run's params (the dispatcher
    refuses the run at admission, or fails the task, with this message);
    ``param`` names the param at fault, when one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


# -- format --------------------------------------------------------------------


def format_problem(text: str) -> str | None:
    """Why ``text`` is not a format for one integer: exactly one conversion of an
    integer type (``d i o u x X``), ``%%`` for a percent sign, a field at most
    MAX_FORMAT_WIDTH wide."""
    if len(text) > MAX_FORMAT:
        return f"format is at most {MAX_FORMAT} characters"
    if "\x00" in text:
        return "format must not contain NUL"
    conversions = 0
    i = 0
    while (i := text.find("%", i)) >= 0:
        if text.startswith("%%", i):
            i += 2
            continue
        m = _CONVERSION.match(text, i)
        assert m is not None  # every part of the pattern after % is optional
        kind = m["type"]
        if kind == "":
            return f"format {text!r} ends with a lone '%' (write '%%' for a percent sign)"
        if kind not in _INTEGER_TYPES:
            return (
                f"format {text!r}: %{kind} is not an integer conversion "
                f"(a sequence formats integers: use one of %d %i %o %u %x %X)"
            )
        for part in ("width", "prec"):
            if m[part] and int(m[part]) > MAX_FORMAT_WIDTH:
                return f"format {text!r}: a field at most {MAX_FORMAT_WIDTH} wide, not {m[part]}"
        conversions += 1
        i = m.end()
    if conversions != 1:
        return f"format {text!r} must have exactly one integer conversion (like %02d), not {conversions}"
    return None


# -- compile ---------------------------------------------------------------------


def _bound(chk: Checker, path: KeyPath, key: str, value: Any, what: str) -> Any | None:
    """An integer, or (count, start, end) ``"params.NAME"`` → ``{"param": NAME}``."""
    if isinstance(value, str) and key in _PARAM_KEYS and value.startswith("params."):
        name = value[len("params.") :]
        if (problem := ident_problem("param", name)) is not None:
            chk.error("bad-ref", (*path, key), f"{what} {key} {value!r}: {problem}")
            return None
        return {"param": name}
    if type(value) is not int:
        need = 'an integer or "params.NAME"' if key in _PARAM_KEYS else "an integer"
        chk.wrong_type((*path, key), value, f"{what}: {key} must be {need}")
        return None
    if abs(value) > MAX_SAFE_INTEGER:  # an integer still: say what is wrong with it
        chk.error(
            "bad-value",
            (*path, key),
            f"{what}: {key} must be within ±(2^53−1) = ±{MAX_SAFE_INTEGER}, not {value}",
        )
        return None
    return value


def check_sequence(
    chk: Checker, path: KeyPath, value: Mapping[str, Any], what: str, *, limit: int
) -> dict[str, Any] | None:
    """A sequence table → its plan form (module doc), or None after diagnostics."""
    ok = True
    bounds: dict[str, Any] = {}
    for k, v in value.items():
        if k == "format":
            if not isinstance(v, str):
                chk.wrong_type((*path, k), v, f'{what}: format must be a string like "%02d"')
                ok = False
            elif (problem := format_problem(v)) is not None:
                chk.error("bad-value", (*path, k), f"{what}: {problem}")
                ok = False
            continue
        checked = _bound(chk, path, k, v, what)
        if checked is None:
            ok = False
        else:
            bounds[k] = checked
    if not ok:
        return None
    if ("count" in value) == ("end" in value):
        chk.error("bad-value", path, f"{what}: a sequence takes exactly one of count and end")
        return None
    start = bounds.get("start", 0)
    step = bounds.get("step", 1)
    if step == 0:
        chk.error("bad-value", (*path, "step"), f"{what}: step must not be 0")
        return None
    count = bounds.get("count")
    if isinstance(count, int) and count < 0:
        chk.error("bad-value", (*path, "count"), f"{what}: count must not be negative, not {count}")
        return None
    end = bounds.get("end")
    if (
        isinstance(end, int)
        and isinstance(start, int)
        and end != start
        and (end > start) != (step > 0)
    ):
        way, fix = ("up", -1) if step > 0 else ("down", 1)
        chk.error(
            "bad-value",
            (*path, "step" if "step" in value else "end"),
            f"{what}: step {step} counts {way} from {start}, so it never reaches end {end} "
            f"(write step = {fix * abs(step)} to count the other way)",
        )
        return None
    seq: dict[str, Any] = {"start": start, "step": step}
    if any(isinstance(b, dict) for b in bounds.values()):
        seq["count" if "count" in bounds else "end"] = bounds.get("count", end)
    else:
        if count is None:
            count = (end - start) // step + 1  # end is inclusive (Argo's withSequence)
        if count > limit:
            chk.error("fanout-too-large", path, f"{what} has {count} numbers, more than {limit:,}")
            return None
        if count and abs(start + (count - 1) * step) > MAX_SAFE_INTEGER:
            chk.error("bad-value", path, f"{what}: the sequence leaves the safe integer range")
            return None
        seq["count"] = count
    if "format" in value:
        seq["format"] = value["format"]
    return {"sequence": seq}


def sequence_params(seq: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(bound key, param name) for each bound of a plan-form sequence that reads a param."""
    return [
        (k, seq[k]["param"])
        for k in _PARAM_KEYS
        if isinstance(seq.get(k), dict) and isinstance(seq[k].get("param"), str)
    ]


def check_sequence_params(
    chk: Checker, path: KeyPath, seq: Mapping[str, Any], params: Mapping[str, Any], what: str
) -> None:
    """Each param a bound reads is declared, of type integer (or any), with an
    integer default (a count's not negative)."""
    for key, name in sequence_params(seq):
        where = (*path, key)
        if name not in params:
            known = ", ".join(sorted(params)) or "none"
            chk.error(
                "fanout-unknown-param",
                where,
                f"{what} {key} reads params.{name}, which is not a declared param "
                f"(declared: {known})",
            )
            continue
        spec = params[name]
        if spec["type"] not in ("integer", "any"):
            chk.error(
                "sequence-not-integer",
                where,
                f"{what} {key} reads params.{name}, declared {spec['type']}; "
                "a sequence bound needs an integer param",
            )
        elif "default" in spec:
            problem = _value_problem(key, spec["default"])
            if problem is not None:
                chk.error(
                    "sequence-not-integer" if "integer" in problem else "bad-value",
                    where,
                    f"{what} {key} reads params.{name}, whose default {problem}",
                )


def _value_problem(key: str, value: Any) -> str | None:
    if type(value) is not int:
        return "is not an integer"
    if abs(value) > MAX_SAFE_INTEGER:
        return f"is outside ±(2^53−1): {value}"
    if key == "count" and value < 0:
        return f"is negative: {value} (a count must not be negative)"
    return None


# -- run ---------------------------------------------------------------------------


def check_sequence_param_values(seq: Mapping[str, Any], params: Mapping[str, Any]) -> None:
    """Admission: each param a bound reads holds an integer (a count one not
    negative). Raises :class:`SequenceProblem` naming the param."""
    for key, name in sequence_params(seq):
        problem = _value_problem(key, params.get(name))
        if problem is not None:
            raise SequenceProblem(f"params.{name} (a sequence's {key}) {problem}", name)


def _resolved(seq: Mapping[str, Any], key: str, params: Mapping[str, Any]) -> Any:
    value = seq.get(key)
    if isinstance(value, dict):
        return params.get(value["param"])
    return value


def sequence_size(seq: Mapping[str, Any], params: Mapping[str, Any] | None = None) -> int | None:
    """How many numbers; None when a bound reads a param and ``params`` is None.
    At run time, an ``end`` the step does not lead to gives an empty sequence
    (``start = "params.n", end = 1, step = -1`` with n = 0 counts nothing)."""
    if params is None and sequence_params(seq):
        return None
    params = params or {}
    start, step = _resolved(seq, "start", params), seq["step"]
    if "count" in seq:
        return int(_resolved(seq, "count", params))
    end = _resolved(seq, "end", params)
    return max(0, (int(end) - int(start)) // int(step) + 1)


def sequence_values(
    seq: Mapping[str, Any], params: Mapping[str, Any], *, limit: int
) -> list[int] | list[str]:
    """The numbers (or, with ``format``, the formatted strings), in order. Raises
    :class:`SequenceProblem` past ``limit`` or outside the safe integer range."""
    check_sequence_param_values(seq, params)
    start, step = _resolved(seq, "start", params), seq["step"]
    count = sequence_size(seq, params)
    assert count is not None
    if count > limit:
        raise SequenceProblem(f"the sequence has {count:,} numbers, more than {limit:,}")
    if count and abs(start + (count - 1) * step) > MAX_SAFE_INTEGER:
        raise SequenceProblem("the sequence leaves the safe integer range ±(2^53−1)")
    numbers = range(start, start + count * step, step)
    fmt = seq.get("format")
    if fmt is None:
        return list(numbers)
    return [fmt % n for n in numbers]


# -- plan <-> manifest, and text --------------------------------------------------


def sequence_to_manifest(seq: Mapping[str, Any]) -> dict[str, Any]:
    """A plan-form sequence in manifest spelling (``{"param": n}`` → ``"params.n"``)."""
    out = dict(seq)
    for key in _PARAM_KEYS:
        value = out.get(key)
        if isinstance(value, dict) and isinstance(value.get("param"), str) and len(value) == 1:
            out[key] = f"params.{value['param']}"
    return out


def describe_sequence(seq: Mapping[str, Any]) -> str:
    """A short human text: ``1..9 step 4``, ``0..params.n-1``, ``"%02d" of 1..5``."""
    shown = sequence_to_manifest(seq)
    start, step = shown["start"], shown["step"]
    stepping = f" step {step}" if step != 1 else ""
    if sequence_params(seq):
        bound = f"end {shown['end']}" if "end" in shown else f"count {shown['count']}"
        text = f"from {start}, {bound}{stepping}"
    elif shown["count"] == 0:
        text = "sequence (empty)"
    else:
        text = f"{start}..{start + (shown['count'] - 1) * step}{stepping}"
    return f"{seq['format']!r} of {text}" if "format" in seq else text
