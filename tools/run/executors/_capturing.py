"""After an attempt's slot: its capture, the agent's response, the cache, and
the final reply a worker sends (crucible.run.executors._unit)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from crucible.core.errors import CrucibleError
from crucible.core.plan import Plan, Task
from crucible.run._options import RunOptions
from crucible.run.engine import _verdict as verdict_rules
from crucible.run.engine._failures import add_log_fields, compose_note, exit_text, tail_text
from crucible.run.executors._attempt import Started
from crucible.run.executors._unit_paths import UnitPaths
from crucible.run.executors._usage import (
    format_memory,
    from_rusage,
    hit_memory_limit,
    memory_limit,
)
from crucible.stage import StateDir, amend_record, escape_key

__all__ = ["CaptureHost", "finish"]

PASSED, FAILED = "passed", "failed"


class CaptureHost(Protocol):
    """What capture reads of the worker's runner (crucible.run.executors._unit.UnitRunner)."""

    model: Plan
    options: RunOptions
    state: Path
    state_dir: StateDir
    paths: UnitPaths
    emit_cap: int
    #: the worker's --cache (crucible.run.cache._unit.UnitCache), or None
    cache: Any
    durable_records: bool

    def sandboxed(self, task: Task) -> bool: ...

    def sandbox(self) -> Any: ...

    def passed(self, key: str | None, workspace: Path, output: Path) -> None: ...


def finish(
    host: CaptureHost,
    started: Started,
    code: int,
    stop_reason: str | None,
    gone: bool,
    held_notes: list[str] | None,
) -> dict[str, Any]:
    """After the slot: the agent's response, capture, the cache, the final reply."""
    staged, proc, sink, agent_out = (
        started.staged,
        started.proc,
        started.sink,
        started.agent_out,
    )
    name, key, task, workspace, output = (
        staged.name, staged.key, staged.task, staged.workspace, staged.output
    )  # fmt: skip
    attempt, cache_key = staged.attempt, staged.cache_key
    log_error = sink.error
    # An agent that exited 0 without a result file: its stdout is `response`.
    response_problem = None
    if agent_out is not None and code == 0 and stop_reason in (None, "interrupt"):
        try:
            response_problem = agent_out.substitute(output)
        except CrucibleError as exc:
            response_problem = str(exc)

    # The log fields cost a stat and a split: only a failure pays for them.
    def log_fields() -> tuple[str | None, str]:
        path = host.paths.log_path(name, key)
        rel = str(path.relative_to(host.state)) if sink.wrote or path.exists() else None
        return rel, tail_text(sink.tail)

    duration = time.monotonic() - proc.started
    usage = from_rusage(proc.usage, proc.spawner_rss_kib)
    finished: dict[str, Any] = {
        "kind": "finished",
        "pid": proc.pid,
        "code": code,
        "duration": duration,
        "stop_reason": stop_reason,
        "staged_env": staged.staged_env,
        "record": None,
        "capture_error": None,
        "log_error": log_error,
        "log": None,
        "tail": "",
        "usage": usage,
    }
    with contextlib.suppress(OSError):
        finished["output_bytes"] = output.stat().st_size
    if cache_key is not None and attempt == 1:  # looked up and missed: why (report)
        finished["cache_miss"] = _miss_reason(host, name, key, cache_key)
    if gone:
        raise SystemExit(70)  # nobody to reply to
    # A task stopped by an interrupt that still exits 0 (a TERM trap that
    # finished its work) is captured like any other: it is what it was.
    written: dict[str, Any] | None = None  # the record as written to the state
    if stop_reason is None or (stop_reason == "interrupt" and code == 0):
        try:
            finished["record"], written = _capture(
                host,
                task,
                name,
                key,
                workspace,
                attempt,
                output,
                code,
                log_fields,
                response_problem=response_problem,
                held_notes=held_notes,
                usage=usage,
            )
        except CrucibleError as exc:
            finished["capture_error"] = str(exc)
    record = finished["record"]
    if record is None or record.get("status") != PASSED:
        finished["log"], finished["tail"] = log_fields()
    elif cache_key is not None and code == 0:
        # store files, then the ledger line: appended by the dispatcher with its
        # batch once the unit's record is durable, unless this worker makes its
        # own records durable (a Dask worker, maybe on another host)
        finished["cache_fact"] = host.cache.save(
            cache_key, defer=not host.durable_records, record=written
        )
    if record is not None and record.get("status") == PASSED:
        host.passed(key, workspace, output)
    if host.cache is not None:
        finished["cache_warnings"] = host.cache.take_warnings()
    return finished


# ------------------------------------------------------- a pipelined worker


def _capture(
    host: CaptureHost,
    task: Task,
    name: str,
    key: str | None,
    workspace: Path,
    attempt: int,
    output: Path,
    code: int,
    log_fields: Callable[[], tuple[str | None, str]],
    response_problem: str | None = None,
    held_notes: list[str] | None = None,
    usage: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Capture one attempt's result; reply with what the scheduler needs (never
    the output itself, which may be large), and the record as written (the
    cache records it without reading it back). A failed record gains the log
    fields and a note naming how it ended (crucible.run.engine._failures)."""
    # The record is built by capture, amended here in memory, and written
    # ONCE, without fsync: the dispatcher's group commit fsyncs the file
    # before any dependant starts (docs/spec/run.md, "Session log").
    record = host.state_dir.capture(
        name,
        workspace,
        output_file=output,
        exit_code=code,
        key=key,
        attempt=attempt,
        emit_cap=host.emit_cap,
        held_notes=held_notes,
        write=False,
        # a passed workspace is emptied of what was captured (one copy),
        # unless it is kept; an evaluate task's verdict may still fail it
        empty_workspace=not host.options.keep_workspaces and task.kind != "evaluate",
    )
    if record.get("status") == PASSED and task.kind == "evaluate":
        record = _apply_verdict(record, output)
    if response_problem is not None:  # an agent's stdout over RESPONSE_MAX
        note = "; ".join(n for n in (response_problem, record.get("note")) if n)
        record = amend_record(record, status=FAILED, note=note, retryable=False)
    sandboxed = host.sandboxed(task)
    if record.get("status") != PASSED:
        log, tail = log_fields()
        record = dict(record)
        note = str(record.get("note", ""))
        if sandboxed:  # led by what the sandbox refused, when its output says
            note = host.sandbox().note(task, str(workspace), str(output.parent), tail, note)
        limit = memory_limit(task, host.options.enforce_memory)
        if limit is not None and code != 0 and hit_memory_limit(tail):
            note = f"killed: exceeded memory {format_memory(limit)} ({exit_text(code)})"
        record["note"] = compose_note(note, code, log, tail)
        add_log_fields(record, log, tail)
    if sandboxed:
        record = {**record, "sandbox": True}
    if usage is not None:  # what the attempt cost (crucible.run.executors._usage)
        record = {**record, "usage": usage}
    wrote = host.state_dir.write_result_where(record, durable=host.durable_records)
    summary = {k: record.get(k) for k in ("status", "note", "retryable", "files_captured")}
    if record.get("files_captured"):
        summary["files_bytes"] = sum(int(f.get("size", 0)) for f in record.get("files", []))
    if not host.durable_records:  # the dispatcher fsyncs these in its group commit
        summary["wrote"] = list(wrote)
    if host.model.workflow.accounted and record.get("status") == PASSED:
        # an accounted run's audit (docs/spec/export.md §4), without a read back
        summary["output"] = record.get("output", {})
    return summary, record


def _miss_reason(host: CaptureHost, name: str, key: str | None, cache_key: Any) -> str:
    """Why a unit the cache was asked for missed (docs/spec/cache.md, "Why
    did it run"), against the last key recorded for it: read before this
    attempt records its own."""
    try:
        last = host.cache.cache.last_components(name, key, escape_key)
        return str(host.cache.keyer.explain(last, cache_key.components))
    except (OSError, CrucibleError, ValueError):
        return "cannot say (the cache's last key cannot be read)"


def _apply_verdict(record: dict[str, Any], output: Path) -> dict[str, Any]:
    """An evaluate task that passed capture passes only with ``verdict: "pass"``.
    Otherwise its captured record (output kept, for settled consumers) is
    amended to a measured failure."""
    value, problem = verdict_rules.check(output)
    if problem is None:
        return record
    return amend_record(
        record, status=FAILED, note=problem, retryable=False, extra={"verdict": value}
    )
