"""Run results computed from several tasks (docs/spec/run.md, "Run results").

A ``[workflow.outputs]`` value is a reference (``a.x``, ``a.items[0]``,
``a.config.region``) or an expression over ``tasks.<task>.<field>`` and
``params.<name>`` (crucible.compile._results). A reference to a mapped task, and
``tasks.m.v`` in an expression, read its **fold**: the values of its passed
instances in item order. An expression is evaluated by the condition language's
bounded evaluator (crucible.compile._bounded: the same time, memory and signal
bounds as ``when``), only when every task it reads passed and carries the field;
otherwise the result is absent and says which task did not.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from crucible.core.plan import Output, Plan, Ref
from crucible.core.refs import RefMissing
from crucible.stage import StateLayout, load_all, load_result

__all__ = ["Absent", "Results"]

#: builds the names an output expression reads from ``_d`` (bound by the evaluator)
_PRELUDE = """
tasks = struct(**{k: struct(**v) for k, v in _d["tasks"].items()})
params = struct(**_d["params"])
"""


class Absent(Exception):
    """A result without a value: ``reason`` (failed, skipped, missing, not-run,
    error) and a one-line ``note``."""

    def __init__(self, reason: str, note: str) -> None:
        super().__init__(note)
        self.reason = reason
        self.note = note


class Results:
    """Reads what the declared results need from one run's state, once per task."""

    def __init__(
        self,
        plan: Plan,
        state: Path,
        *,
        cancelled: Callable[[], bool] | None = None,
    ) -> None:
        self.state = state
        self.cancelled = cancelled
        self.names = frozenset(plan.by_name)
        self.mapped = frozenset(t.name for t in plan.tasks if t.fans_out)
        self._records: dict[str, dict[str, Any] | None] = {}
        self._params: dict[str, Any] | None = None
        self._folds: dict[tuple[str, str], list[Any]] = {}

    def value(self, form: Output) -> Any:
        """A declared result's value (a reference the model parsed with the plan's
        task names, or an expression), or :class:`Absent`."""
        if isinstance(form, Ref):
            value = self.field(form.producer, form.field)
            try:
                return form.at(value)
            except RefMissing as exc:
                raise Absent("missing", exc.message) from None
        return self._computed(form.expression)

    def _record(self, task: str) -> dict[str, Any] | None:
        if task not in self._records:
            self._records[task] = load_result(self.state, task)
        return self._records[task]

    def field(self, task: str, field: str) -> Any:
        """A passed task's field; a mapped task's fold (passed instances' values in
        item order); else :class:`Absent` saying why."""
        record = self._record(task)
        if record is None:
            raise Absent("not-run", f"{task!r} did not settle in this run")
        status = str(record.get("status"))
        if status != "passed":
            note = str(record.get("note") or "")
            raise Absent(status, f"{task!r}: {note}" if note else f"{task!r} {status}")
        if task in self.mapped:
            if (task, field) not in self._folds:  # one read of the instances' records
                records = load_all(self.state, task)
                fold = []
                for key in record.get("keys", []):
                    irec = records.get(key)
                    passed = irec is not None and irec.get("status") == "passed"
                    output = irec.get("output") if irec is not None and passed else None
                    if isinstance(output, dict) and field in output:
                        fold.append(output[field])
                self._folds[(task, field)] = fold
            return self._folds[(task, field)]
        output = record.get("output")
        if not isinstance(output, dict) or field not in output:
            # capture fails a producer without a declared field; kept for records written otherwise
            raise Absent("missing", f"{task!r} passed without the field {field!r}")
        return output[field]

    def _params_value(self) -> dict[str, Any]:
        if self._params is None:
            import orjson  # the fast JSON reader: only when an expression reads params

            path = StateLayout(self.state).params_path
            try:
                self._params = dict(orjson.loads(Path(path).read_bytes()))
            except (OSError, ValueError):
                self._params = {}
        return self._params

    def _computed(self, expression: str) -> Any:
        # compile is imported only for plans with an output expression (starlark)
        from crucible.compile import evaluate_expression, expression_reads

        tasks: dict[str, dict[str, Any]] = {}
        params: dict[str, Any] = {}
        for parts in expression_reads(expression):
            if parts[0] == "params" and len(parts) > 1:
                all_params = self._params_value()
                if parts[1] in all_params:
                    params[parts[1]] = all_params[parts[1]]
            elif parts[0] == "tasks" and len(parts) > 2:
                tasks.setdefault(parts[1], {})[parts[2]] = self.field(parts[1], parts[2])
        done = evaluate_expression(
            expression, {"tasks": tasks, "params": params}, _PRELUDE, cancelled=self.cancelled
        )
        if done.kind == "value":
            return done.value
        if done.kind == "cancelled":
            raise Absent("not-run", "the run was stopping: the expression was not evaluated")
        raise Absent("error", f"{expression}: {done.message or done.kind}")
