"""``[workflow.outputs]``: run results read from one task or computed from several.

A result is a **reference** (``"sum.total"``, ``"a.items[0]"``, ``"a.config.region"``:
crucible.core.refs) or an **expression** in the condition language over
``tasks.<task>.<field>`` and ``params.<name>`` (``"tasks.a.x + tasks.b.y"``,
``"len(tasks.m.v)"``, ``"tasks.h.v if tasks.flip.v == 'heads' else tasks.t.v"``).
A string that parses as a reference and starts with neither ``tasks.`` nor
``params.`` (``params`` is never a task name) is a
reference; any other string is an expression; ``{ expression = "..." }`` says so
explicitly. Plan forms: a reference stays a string, an expression is
``{"expression": text}`` (docs/spec/plan-ir.md). A mapped task's field is its fold:
a list of the values of its passed instances, in item order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from crucible.compile import _checker as checker
from crucible.compile._checker import Checker
from crucible.compile._conditions import _BUILTINS, condition_reads, parse_condition
from crucible.compile._diagnostics import KeyPath
from crucible.compile._rules import check_ref_path
from crucible.core.refs import RefSyntax, parse_ref

__all__ = [
    "EXPRESSION_ROOTS",
    "check_outputs",
    "check_outputs_graph",
    "expression_reads",
    "is_expression",
]

#: the names an output expression may start from
EXPRESSION_ROOTS = ("tasks", "params")


def is_expression(form: object) -> bool:
    """A plan output form that is an expression (``{"expression": text}``)."""
    return isinstance(form, dict) and isinstance(form.get("expression"), str)


def _output_form(chk: Checker, path: KeyPath, name: str, value: Any) -> Any | None:
    explicit = isinstance(value, dict)
    if explicit:
        if not chk.known_keys(path, value, ("expression",), f"output {name!r}"):
            return None
        if "expression" not in value:
            chk.error("missing-key", path, f"output {name!r} has no expression")
            return None
        path, value = (*path, "expression"), value["expression"]
    what = f"output {name!r}"
    if not checker.check_str(chk, path, value, what, nonempty=True):
        return None
    if not explicit and not value.startswith(("tasks.", "params.")):
        try:
            parse_ref(value)
        except RefSyntax:
            pass
        else:
            return value
    tree = parse_condition(value)
    if isinstance(tree, str):
        chk.error(
            "output-syntax",
            path,
            f'{what} {value!r} is neither a reference "task.field" nor one expression: {tree}',
        )
        return None
    return {"expression": value}


def check_outputs(chk: Checker, path: KeyPath, value: Any) -> dict[str, Any]:
    """``[workflow.outputs]`` (or a plan's ``workflow.outputs``): result name →
    its plan form (module doc)."""
    out: dict[str, Any] = {}
    entries = chk.named_entries(
        path, value, "output", 'outputs must be a table of name = "task.field" or an expression'
    )
    for name, spec, opath in entries:
        form = _output_form(chk, opath, name, spec)
        if form is not None:
            out[name] = form
    return out


def expression_reads(text: str) -> list[tuple[str, ...]]:
    """The name chains an output expression reads (its ``tasks.T.F`` and
    ``params.P``), in the order they appear; builtins are left out."""
    tree = parse_condition(text)
    if isinstance(tree, str):
        return []
    return [r.parts for r in condition_reads(tree) if r.parts[0] not in _BUILTINS]


def check_outputs_graph(
    chk: Checker, workflow: Mapping[str, Any], by_name: Mapping[str, dict[str, Any]]
) -> None:
    """Every task, field and param a result reads exists; a reference's path suits
    what its producer declares (crucible.compile._rules.check_ref_path)."""
    params = workflow.get("params", {})
    for name, form in workflow.get("outputs", {}).items():
        where = ("workflow", "outputs", name)
        if isinstance(form, str):
            _check_ref(chk, where, name, form, by_name)
            continue
        for parts in expression_reads(form["expression"]):
            _check_read(chk, where, name, parts, by_name, params)


def _check_ref(
    chk: Checker, where: KeyPath, name: str, text: str, by_name: Mapping[str, dict[str, Any]]
) -> None:
    ref = parse_ref(text, by_name)
    task = by_name.get(ref.producer)
    if task is None:
        chk.error(
            "output-unknown-task",
            where,
            f"output {name!r} reads {text!r}, but {ref.producer!r} is not a task of this workflow",
        )
    elif ref.field not in task["emits"]:
        chk.error(
            "output-unknown-field",
            where,
            f"output {name!r} reads {text!r}, but {ref.producer!r} does not declare "
            f"the field {ref.field!r} in emits",
        )
    elif ref.path:
        check_ref_path(chk, where, f"output {name!r}", ref, task)


def _check_read(
    chk: Checker,
    where: KeyPath,
    name: str,
    parts: tuple[str, ...],
    by_name: Mapping[str, dict[str, Any]],
    params: Mapping[str, Any],
) -> None:
    root = parts[0]
    shown = ".".join(parts)
    what = f"output {name!r}"
    if root not in EXPRESSION_ROOTS:
        chk.error(
            "output-unknown-name",
            where,
            f"{what}: unknown name {root!r} (an output expression reads "
            "tasks.TASK.FIELD and params.NAME)",
        )
    elif root == "params" and (len(parts) < 2 or parts[1] not in params):
        chk.error(
            "output-unknown-name",
            where,
            f"{what}: {shown}: "
            + (f"no param {parts[1]!r} is declared" if len(parts) > 1 else "read params.NAME"),
        )
    elif root == "params":
        return
    elif len(parts) < 3:
        chk.error(
            "output-unknown-name", where, f"{what}: {shown}: read one field, tasks.TASK.FIELD"
        )
    elif parts[1] not in by_name:
        chk.error(
            "output-unknown-task",
            where,
            f"{what}: {shown}: {parts[1]!r} is not a task of this workflow",
        )
    elif parts[2] not in by_name[parts[1]]["emits"]:
        chk.error(
            "output-unknown-field",
            where,
            f"{what}: {shown}: {parts[1]!r} does not declare the field {parts[2]!r} in emits",
        )
