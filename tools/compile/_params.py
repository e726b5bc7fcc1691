"""Resolve a run's params against the plan's params schema (dispatch uses this).

``check(plan, supplied)`` returns the resolved params object: every declared
param, from ``supplied`` or its default. It raises :class:`InputRefused` naming
the param when one is unknown, missing (no default), or of the wrong type.
``coerce(plan, name, text)`` turns a command-line ``name=text`` into a typed value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from crucible.compile._checker import is_json_value, type_name, value_matches
from crucible.core.errors import InputRefused

__all__ = ["check", "check_params", "coerce"]


def _schema(plan: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    params = plan.get("workflow", {}).get("params", {})
    return dict(params)


def check(plan: Mapping[str, Any], supplied: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved params object (declared names only, defaults filled in)."""
    schema = _schema(plan)
    for name in supplied:
        if name not in schema:
            known = ", ".join(sorted(schema)) or "none"
            raise InputRefused(
                f"unknown param {name!r} (declared: {known})", where=f"params.{name}"
            )
    resolved: dict[str, Any] = {}
    for name, spec in schema.items():
        if name in supplied:
            value = supplied[name]
            if not is_json_value(value) or not value_matches(spec["type"], value):
                raise InputRefused(
                    f"param {name!r} must be a JSON {spec['type']}, not {type_name(value)}",
                    where=f"params.{name}",
                )
            resolved[name] = value
        elif "default" in spec:
            resolved[name] = spec["default"]
        else:
            raise InputRefused(
                f"param {name!r} is required (it has no default)", where=f"params.{name}"
            )
    return resolved


#: the public name (crucible.compile.check_params): what dispatch resolves a run's params with
check_params = check


def coerce(plan: Mapping[str, Any], name: str, text: str) -> Any:
    """A command-line value for param ``name``: strings as is, everything else as JSON
    (``true``, ``3``, ``[1, 2]``, ``{"a": 1}``)."""
    schema = _schema(plan)
    if name not in schema:
        known = ", ".join(sorted(schema)) or "none"
        raise InputRefused(f"unknown param {name!r} (declared: {known})", where=f"params.{name}")
    type_ = schema[name]["type"]
    if type_ == "string":
        return text
    try:
        value = json.loads(text)
    except ValueError:
        if type_ == "any":
            return text
        raise InputRefused(
            f"param {name!r} expects a {type_}; {text!r} is not JSON", where=f"params.{name}"
        ) from None
    if not is_json_value(value) or not value_matches(type_, value):
        raise InputRefused(
            f"param {name!r} must be a {type_}, not {type_name(value)}", where=f"params.{name}"
        )
    return value
