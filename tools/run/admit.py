"""Admitting a run: load the plan, resolve params, claim or reopen the state dir.

A fresh run needs a state dir without ``plan.json``; it writes ``plan.json``
(the admitted canonical bytes) and ``params.json``. ``--resume`` needs both,
recompiles or reloads PLAN, and refuses with :class:`PlanChanged` when the
digest differs from the admitted one, so a run keeps its IR version and
graph for its whole life.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crucible.core import atomic, canon, digest
from crucible.core.contract import EMIT_CAP_DEFAULT
from crucible.core.errors import InputRefused, OperationalError, PlanChanged, UsageError
from crucible.run.options import RunOptions
from crucible.run.params import read_params_file, resolve_params

__all__ = ["Admission", "admit", "emit_cap_from"]


@dataclass(frozen=True)
class Admission:
    plan: dict[str, Any]
    data: bytes
    digest: str
    params: dict[str, Any]
    emit_cap: int
    warnings: tuple[str, ...]


def emit_cap_from(options: RunOptions, environ: dict[str, str] | os._Environ[str]) -> int:
    if options.emit_cap is not None:
        cap = options.emit_cap
        where = "--emit-cap"
    else:
        text = environ.get("CRUCIBLE_EMIT_CAP")
        if not text:
            return EMIT_CAP_DEFAULT
        where = "CRUCIBLE_EMIT_CAP"
        try:
            cap = int(text)
        except ValueError:
            raise UsageError(f"not an integer: {text!r}", where=where) from None
    if cap < 1:
        raise UsageError("the emit cap must be at least 1 byte", where=where)
    return cap


def _load(path: Path) -> tuple[dict[str, Any], bytes, str, tuple[str, ...]]:
    from crucible.compile import load_any

    if str(path) != "-" and not path.exists():
        raise UsageError("no such plan or manifest", where=str(path))
    compiled = load_any(path)
    return compiled.plan, compiled.data, compiled.digest, tuple(compiled.warnings)


def admit(options: RunOptions, environ: dict[str, str] | os._Environ[str]) -> Admission:
    plan, data, plan_digest, warnings = _load(options.plan)
    state = options.state
    emit_cap = emit_cap_from(options, environ)
    if any(t.get("kind") == "agent" for t in plan["tasks"]) and not options.agent_cmd:
        names = ", ".join(t["name"] for t in plan["tasks"] if t.get("kind") == "agent")
        raise UsageError(f"the plan has agent tasks ({names}): pass --agent-cmd CMD")
    given = read_params_file(options.params_file) if options.params_file else {}
    params = resolve_params(plan, given, options.params)
    plan_file = state / "plan.json"
    if options.resume:
        try:
            admitted = plan_file.read_bytes()
        except FileNotFoundError:
            raise InputRefused(
                "nothing to resume: no plan.json in the state dir", where=str(state)
            ) from None
        except OSError as exc:
            raise OperationalError(f"cannot read {plan_file}: {exc.strerror}") from None
        admitted_digest = digest.of_bytes(admitted)
        if admitted_digest != plan_digest:
            raise PlanChanged(
                f"the plan changed since the run started: run {admitted_digest}, now {plan_digest}",
                where=str(options.plan),
            )
        stored = _read_json(state / "params.json")
        if (options.params_file or options.params) and canon.dumps(params) != canon.dumps(stored):
            raise InputRefused(
                "params differ from the ones the run started with; resume without --params/-p",
                where=str(state / "params.json"),
            )
        return Admission(plan, data, plan_digest, stored, emit_cap, warnings)
    if plan_file.exists():
        admitted_digest = digest.of_bytes(plan_file.read_bytes())
        if admitted_digest != plan_digest:
            raise InputRefused(
                f"the state dir holds a run of another plan ({admitted_digest}, this plan {plan_digest}): use a fresh --state",
                where=str(state),
            )
        raise InputRefused(
            "the state dir already holds a run of this plan: pass --resume or use a fresh --state",
            where=str(state),
        )
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OperationalError(
            f"cannot create state dir: {exc.strerror}", where=str(state)
        ) from None
    atomic.write_json(state / "params.json", params)
    # plan.json last: its presence is what marks the state dir as claimed.
    atomic.write_bytes(plan_file, data)
    return Admission(plan, data, plan_digest, params, emit_cap, warnings)


def _read_json(path: Path) -> Any:
    try:
        return canon.loads(path.read_bytes())
    except FileNotFoundError:
        raise InputRefused(
            "the state dir is incomplete (no params.json)", where=str(path)
        ) from None
    except OSError as exc:
        raise OperationalError(f"cannot read: {exc.strerror}", where=str(path)) from None
