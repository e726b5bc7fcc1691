"""The checker every structural check writes its diagnostics to, and the value
checks the table checks share (types, references, params): apart from the
table checks (:mod:`crucible.compile._shape`) so that the checks it calls
(fan-outs, conditions, reads, rules) import it without a circle."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from crucible.compile._diagnostics import Diagnostic, KeyPath, Locator
from crucible.compile._editions import (
    TYPES,
)
from crucible.compile._names import ident_problem
from crucible.core.canon import MAX_SAFE_INTEGER
from crucible.core.contract import json_type
from crucible.core.refs import Ref, RefSyntax, parse_ref

__all__ = [
    "MAX_DEFAULT_DEPTH",
    "PARAM_KEYS",
    "Checker",
    "check_params",
    "check_ref",
    "check_str",
    "check_str_list",
    "check_type",
    "input_form",
    "is_json_value",
    "json_depth",
    "split_ref",
    "str_items",
    "to_json",
    "type_name",
    "value_matches",
]

PARAM_KEYS: tuple[str, ...] = ("type", "default", "description")


class Checker:
    """Collects diagnostics, locating each through a :class:`Locator`."""

    def __init__(self, locator: Locator) -> None:
        self.locator = locator
        self.diagnostics: list[Diagnostic] = []

    def error(self, code: str, path: KeyPath, message: str) -> None:
        self.diagnostics.append(Diagnostic(code, message, self.locator.locate(path)))

    def wrong_type(self, path: KeyPath, value: object, expected: str) -> None:
        """The ``wrong-type`` error every checker words alike: ``EXPECTED, not TYPE``."""
        self.error("wrong-type", path, f"{expected}, not {type_name(value)}")

    def known_keys(
        self, path: KeyPath, table: Mapping[str, Any], allowed: tuple[str, ...], label: str
    ) -> bool:
        """True when every key of ``table`` is ``allowed``; else an ``unknown-key``
        error for each other one (a ``label`` ending in ``()`` names a call's keywords)."""
        ok = True
        for key in table:
            if key not in allowed:
                noun = "keyword argument" if label.endswith("()") else "key"
                self.error(
                    "unknown-key",
                    (*path, key),
                    f"unknown {noun} {key!r} in {label} (known: {', '.join(allowed)})",
                )
                ok = False
        return ok

    def named_entries(
        self, path: KeyPath, table: object, kind: str, expected: str
    ) -> Iterator[tuple[str, Any, KeyPath]]:
        """``(name, value, path)`` of each entry of a table keyed by ``kind`` names
        (identifiers): a ``wrong-type`` error (``EXPECTED, not TYPE``) when ``table``
        is not a table, a ``bad-name`` error for each key that is not a name."""
        if not isinstance(table, dict):
            self.wrong_type(path, table, expected)
            return
        for name, value in table.items():
            where = (*path, name)
            if (problem := ident_problem(kind, name)) is not None:
                self.error("bad-name", where, problem)
                continue
            yield name, value, where

    @property
    def failed(self) -> bool:
        return any(d.severity == "error" for d in self.diagnostics)


def type_name(value: object) -> str:
    """The TOML/JSON name of a value's type, for messages: JSON's names
    (:func:`crucible.core.contract.json_type`) but TOML's ``float`` and ``table``."""
    if isinstance(value, float):
        return "float"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list | tuple):
        return "array"
    if value is None or isinstance(value, bool | int | str):
        return json_type(value)
    return type(value).__name__


def is_json_value(value: object) -> bool:
    """True for values in the canonical JSON domain (no datetimes, NaN, huge ints)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if v is None or isinstance(v, bool | str):
            continue
        if isinstance(v, int):
            if abs(v) > MAX_SAFE_INTEGER:
                return False
        elif isinstance(v, float):
            if not math.isfinite(v):
                return False
        elif isinstance(v, list | tuple):
            stack.extend(v)
        elif isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                return False
            stack.extend(v.values())
        else:
            return False
    return True


#: deepest nesting of arrays/objects a literal of the manifest may have (a param
#: default, a literal fan-out's items, a matrix entry's value): the plan wraps a
#: literal in at most eight more levels (tasks[i].matrix.axes[j].source.items) and
#: canonical JSON stops at 128 (canon.MAX_DEPTH), so a deeper literal could not be
#: written out (or read back by dispatch).
MAX_DEFAULT_DEPTH = 120


def json_depth(value: object) -> int:
    """Nesting depth of arrays/objects in ``value`` (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, list | tuple):
            items: Any = v
        elif isinstance(v, dict):
            items = v.values()
        else:
            continue
        depth += 1
        deepest = max(deepest, depth)
        stack.extend((item, depth) for item in items)
    return deepest


def value_matches(type_: str, value: object) -> bool:
    """Does ``value`` (already a JSON value) have the declared ``type_``?"""
    if type_ == "any":
        return True
    if type_ == "string":
        return isinstance(value, str)
    if type_ == "boolean":
        return isinstance(value, bool)
    if type_ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if type_ == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if type_ == "array":
        return isinstance(value, list | tuple)
    if type_ == "object":
        return isinstance(value, dict)
    return False


def split_ref(ref: str) -> tuple[str, str] | None:
    """``"producer.field"`` → (producer, field), split at the last dot (field names
    hold no dot; task names may), by the one reference parser (crucible.core.refs);
    None for anything else, a reference with a path too (editions 1-3 have none)."""
    try:
        parsed = parse_ref(ref)
    except RefSyntax:
        return None
    if parsed.path or ident_problem("field", parsed.field) is not None:
        return None
    return parsed.producer, parsed.field


def check_str(chk: Checker, path: KeyPath, value: object, what: str, *, nonempty: bool) -> bool:
    if not isinstance(value, str):
        chk.wrong_type(path, value, f"{what} must be a string")
        return False
    if nonempty and not value.strip():
        chk.error("bad-value", path, f"{what} must not be empty")
        return False
    return True


def check_str_list(chk: Checker, path: KeyPath, value: object, what: str) -> list[str] | None:
    if not isinstance(value, list | tuple):
        chk.wrong_type(path, value, f"{what} must be an array of strings")
        return None
    return str_items(chk, path, value, what)


def str_items(chk: Checker, path: KeyPath, value: Sequence[object], what: str) -> list[str] | None:
    """The items of an array that must be distinct strings (each bad one named), or None."""
    out: list[str] = []
    ok = True
    for i, item in enumerate(value):
        if not isinstance(item, str):
            chk.wrong_type((*path, i), item, f"{what}[{i}] must be a string")
            ok = False
        elif item in out:
            chk.error("duplicate-entry", (*path, i), f"{what} lists {item!r} twice")
            ok = False
        else:
            out.append(item)
    return out if ok else None


def check_type(chk: Checker, path: KeyPath, value: object, what: str) -> str | None:
    if not isinstance(value, str) or value not in TYPES:
        chk.error(
            "bad-type-name",
            path,
            f"{what} must be one of {', '.join(TYPES)}, not {value!r}",
        )
        return None
    return value


def check_ref(
    chk: Checker, path: KeyPath, value: object, what: str, *, paths: bool = False
) -> str | None:
    """A reference's syntax; ``paths`` (edition 4): element ``[n]`` and member
    ``.k`` steps may follow the field (crucible.core.refs)."""
    if not check_str(chk, path, value, what, nonempty=True):
        return None
    assert isinstance(value, str)
    if paths:
        try:
            parse_ref(value)
        except RefSyntax as exc:
            chk.error(
                "bad-ref",
                path,
                f'{what} {value!r} is not of the form "producer.field", optionally '
                f"followed by [INDEX] and .MEMBER steps: {exc.message}",
            )
            return None
        return value
    if split_ref(value) is None:
        chk.error(
            "bad-ref",
            path,
            f'{what} {value!r} is not of the form "producer.field" '
            "(field: a letter or _, then letters, digits, _ or -)",
        )
        return None
    return value


def input_form(ref: Ref, type_: str | None = None) -> dict[str, Any]:
    """A declared input's plan form: ``from`` as written, its producer and field,
    and (edition 4, omitted when empty) the ``path`` of element indexes and member
    names into the field's value (docs/spec/plan-ir.md)."""
    spec: dict[str, Any] = {
        "from": ref.text,
        "producer": ref.producer,
        "field": ref.field,
        "type": type_,
    }
    if ref.path:
        spec["path"] = list(ref.path)
    return spec


def check_params(chk: Checker, path: KeyPath, raw: object) -> dict[str, Any]:
    """``[workflow.params.NAME]`` tables → ``{name: {type, default?, description?}}``."""
    params: dict[str, Any] = {}
    for name, spec, ppath in chk.named_entries(path, raw, "param", "params must be a table"):
        if not isinstance(spec, dict):
            chk.wrong_type(ppath, spec, f"param {name!r} must be a table with a type")
            continue
        chk.known_keys(ppath, spec, PARAM_KEYS, f"param {name!r}")
        if "type" not in spec:
            chk.error("missing-key", ppath, f"param {name!r} has no type")
            continue
        type_ = check_type(chk, (*ppath, "type"), spec["type"], f"type of param {name!r}")
        if type_ is None:
            continue
        out: dict[str, Any] = {"type": type_}
        if "default" in spec:
            default = spec["default"]
            if json_depth(default) > MAX_DEFAULT_DEPTH:
                chk.error(
                    "bad-default",
                    (*ppath, "default"),
                    f"default of param {name!r} is nested deeper than {MAX_DEFAULT_DEPTH} levels",
                )
            elif not is_json_value(default) or not value_matches(type_, default):
                chk.error(
                    "bad-default",
                    (*ppath, "default"),
                    f"default of param {name!r} is not a JSON {type_} (got {type_name(default)})",
                )
            else:
                out["default"] = to_json(default)
        if "description" in spec and check_str(
            chk, (*ppath, "description"), spec["description"], "description", nonempty=False
        ):
            out["description"] = spec["description"]
        params[name] = out
    return params


def to_json(value: Any) -> Any:
    """Tuples (from Starlark) become lists; everything else is already JSON."""
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value
