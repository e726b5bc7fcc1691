"""Run results: ``STATE/outputs.json`` from ``[workflow.outputs]`` (IR v3).

After the run (passed, failed or interrupted) the dispatcher writes one canonical
JSON object, atomically: each result whose producers passed maps to its value
(read, or computed: crucible.run.session._computed), so ``jq .total`` reads it; the members whose
names start with ``@`` (never a result name: those are identifiers) say what
the file is and why any result is absent. docs/spec/run.md, "Run results";
schema docs/schemas/outputs.json.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from crucible.core import atomic, canon
from crucible.core.errors import OperationalError
from crucible.core.fdio import write_all
from crucible.core.plan import Plan

__all__ = ["OUTPUTS_FORMAT", "build_outputs", "copy_outputs", "finish_results", "write_outputs"]

OUTPUTS_FORMAT = "crucible.outputs/1"


def build_outputs(plan: Plan, state: Path, digest: str, status: str) -> dict[str, Any]:
    """The outputs object of the run in ``state`` (see module doc): each declared
    result read or computed by :class:`crucible.run.session._computed.Results`."""
    # lazy: run.session._computed (and stage) are not loaded with this module;
    # only build_outputs() needs them
    from crucible.run.session._computed import Absent, Results

    declared = plan.workflow.outputs
    doc: dict[str, Any] = {
        "@format": OUTPUTS_FORMAT,
        "@plan": digest,
        "@run": status,
        "@from": plan.workflow.to_json().get("outputs", {}),  # as the plan spells them
        "@absent": {},
    }
    results = Results(plan, state)
    for name, form in declared.items():
        try:
            doc[name] = results.value(form)
        except Absent as why:
            doc["@absent"][name] = {"reason": why.reason, "note": why.note}
    return doc


def _layout(state: Path) -> Any:
    from crucible.stage import StateLayout  # lazily: stage is heavy for --help

    return StateLayout(state)


def write_outputs(plan: Plan, state: Path, digest: str, status: str) -> bytes:
    """Write ``STATE/outputs.json`` atomically; returns its bytes."""
    data = canon.dumps(build_outputs(plan, state, digest, status))
    atomic.write_bytes(_layout(state).outputs_path, data)
    return data


def finish_results(
    admission: Any,
    options: Any,
    status: str,
    on_warning: Callable[[str], None] | None = None,
) -> None:
    """After the run: ``STATE/outputs.json`` when the plan declares outputs or
    ``--outputs`` asks for them; then ``--publish-dir`` (not after an interrupted
    run: a resume finishes it and publishes then)."""
    plan = admission.model
    if plan.workflow.outputs or options.outputs is not None:
        doc = build_outputs(plan, options.state, admission.digest, status)
        atomic.write_bytes(_layout(options.state).outputs_path, canon.dumps(doc))
        if status == "passed" and doc["@absent"] and on_warning is not None:
            on_warning(_absent_warning(doc, _layout(options.state).outputs_path))
    if options.publish_dir is None:
        return
    if not plan.workflow.publish:
        if on_warning is not None:
            on_warning("--publish-dir given, but the plan has no [workflow.publish]")
        return
    if status == "interrupted":
        return
    # lazy: run.session._publish is not loaded with this module; only finish_results() needs it
    from crucible.run.session._publish import publish

    publish(plan, options.state, options.publish_dir, admission.digest)


def _absent_warning(doc: Mapping[str, Any], path: Path) -> str:
    """A passed run whose declared outputs are (partly) absent, said once: tolerated
    failures and skips let a run pass without the tasks that produce its results
    (issue 27 item 15)."""
    absent = doc["@absent"]
    shown = "; ".join(f"{name} ({why['note']})" for name, why in list(absent.items())[:3])
    more = len(absent) - 3
    return (
        f"the run passed, but {len(absent)} of {len(doc['@from'])} declared outputs are "
        f"absent: {shown}" + (f" and {more} more" if more > 0 else "") + f" (see {path})"
    )


def copy_outputs(state: Path, target: str, out: BinaryIO | None, fd: int | None = None) -> None:
    """``--outputs -|FILE``: the bytes of STATE/outputs.json, to ``out`` or FILE
    (through :mod:`crucible.core.output`, as every command's output: a FIFO or a
    device is written through, a regular file replaced atomically). ``fd``: a
    FIFO's write end opened at admission (crucible.run.session._preflight)."""
    # lazy: core.output is not loaded with this module; only copy_outputs() needs it
    from crucible.core.output import write_output, write_stream

    path = _layout(state).outputs_path
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise OperationalError(f"cannot read: {exc.strerror}", where=str(path)) from None
    if target == "-":
        assert out is not None
        write_stream(out, data + b"\n")
    elif fd is not None:
        try:
            write_all(fd, data)
        except OSError as exc:
            raise OperationalError(
                f"cannot write the outputs: {exc.strerror or exc}", where=target
            ) from None
    else:
        write_output(target, data)
