"""``crucible-dispatch report`` and ``cache forget|gc``: what they do, without click
(re-exported by :mod:`crucible.run.commands`, which holds run's verb; these are
loaded only when one of them runs)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from crucible.core.errors import EXIT_OK, InputRefused, UsageError
from crucible.core.structs import dataclass
from crucible.run._edge import PROG, warner

__all__ = [
    "CacheForgetOptions",
    "CacheGcOptions",
    "ReportOptions",
    "run_cache_forget",
    "run_cache_gc",
    "run_report",
]


@dataclass(frozen=True)
class ReportOptions:
    """``crucible-dispatch report``: the state dir and how to show it."""

    state: Path
    #: one task's instances instead of the task table
    task: str | None = None
    #: ``--html FILE|-``: the HTML timeline instead of the table
    html_file: str | None = None
    as_json: bool = False
    #: ``--tsv FILE|-``: the trace (one line per attempt) instead of the table
    tsv_file: str | None = None


@dataclass(frozen=True)
class CacheForgetOptions:
    """``crucible-dispatch cache forget``: the task whose results go."""

    task: str
    cache: Path | None


@dataclass(frozen=True)
class CacheGcOptions:
    """``crucible-dispatch cache gc``: the cache and how young a file is kept."""

    cache: Path | None
    #: store files younger than this many seconds are kept
    grace: float = 60.0


def run_report(opts: ReportOptions, out: BinaryIO, err: TextIO) -> int:
    """The task table (or one task's instances), the NDJSON rows, the trace
    (``--tsv``), or the HTML page, on ``out`` (UTF-8)."""
    # lazy: only run_report() needs it (start-up)
    from crucible.core import ndjson, output
    from crucible.run.report import _report as report

    state, task = opts.state, opts.task
    if not state.is_dir():
        raise InputRefused("no such state dir", where=str(state))
    if opts.tsv_file is not None and (opts.html_file is not None or opts.as_json):
        raise UsageError("--tsv goes alone (not with --html or --json)")
    # the trace lists every attempt: nothing folded (crucible.run.report._fold)
    fold_above = None if opts.tsv_file is not None else report.FOLD_ABOVE
    rows = report.collect(state, task, fold_above=fold_above)
    if opts.tsv_file is not None:
        # lazy: run.report._usage is not loaded with this module; only run_report() needs it
        from crucible.run.report._usage import render_tsv

        trace = io.StringIO()
        render_tsv(((r.task, r.key, t) for r in rows for t in r.tries), trace)
        if opts.tsv_file == "-":
            out.write(trace.getvalue().encode("utf-8"))
        else:
            output.write_output(opts.tsv_file, trace.getvalue().encode("utf-8"))
            err.write(f"{PROG}: wrote {opts.tsv_file}\n")
        return EXIT_OK
    if opts.html_file is not None:
        from crucible.run.report import _timeline as timeline  # --html only

        page = timeline.render_report(rows, title=f"crucible run {state}")
        if opts.html_file == "-":
            out.write(page.encode("utf-8"))
        else:
            output.write_output(opts.html_file, page.encode("utf-8"))  # a device/FIFO: streamed
            err.write(f"{PROG}: wrote {opts.html_file}\n")
        return EXIT_OK
    if opts.as_json:
        instances = task is not None
        for r in rows:
            if r.key is None or instances:
                out.write(ndjson.dumps_line(report.row_json(r)))
        if rows.loop is not None:  # a scored loop: one more line, {"loop": ...}
            from crucible.run.report import _loop_view as loop_view

            out.write(ndjson.dumps_line({"loop": loop_view.to_json(rows.loop)}))
        if task is None:
            from crucible.run.report._accounting import accounting_line  # accounted runs only

            if (line := accounting_line(state)) is not None:
                out.write(ndjson.dumps_line(line))
        return EXIT_OK

    table = io.StringIO()
    report.render_table(rows, table, instances=task is not None)
    if task is None:
        report.render_outputs(state, table)
        report.render_freed(state, table)
        from crucible.run.report._accounting import render_accounting  # accounted runs only

        render_accounting(state, table)
    out.write(table.getvalue().encode("utf-8"))
    return EXIT_OK


def _cache_dir(cache: Path | None) -> Path | None:
    """The --cache DIR of a maintenance command: None when it does not exist yet."""
    if cache is None:
        raise UsageError("give the cache directory: --cache DIR (or CRUCIBLE_CACHE)")
    if not os.path.lexists(cache):
        return None
    if not cache.is_dir():
        raise UsageError("not a directory", where=str(cache))
    return cache


def _json_line(out: BinaryIO, value: dict[str, Any], *, sort_keys: bool = False) -> None:
    # lazy: json costs start-up; only _json_line() needs it
    import json

    out.write((json.dumps(value, sort_keys=sort_keys, separators=(",", ":")) + "\n").encode())
    out.flush()


def run_cache_forget(opts: CacheForgetOptions, out: BinaryIO, err: TextIO) -> int:
    """Drop every cached result of the task; ``{"forgotten": N, "task": T}`` on ``out``."""
    # lazy: only run_cache_forget() needs it (start-up)
    from crucible.core.contract import task_name_problems
    from crucible.run.cache._store import TaskCache
    from crucible.stage import escape_key

    problems = task_name_problems(opts.task)
    if problems:  # no task has it: {"forgotten": 0} would say the cache held none
        raise UsageError(f"{problems[0][1]}: no task can have this name")
    directory = _cache_dir(opts.cache)
    n = 0
    if directory is not None:
        tc = TaskCache(directory, warn=warner(err))
        try:
            n = tc.forget(opts.task, escape_key)
        finally:
            tc.close()
    _json_line(out, {"forgotten": n, "task": opts.task})
    return EXIT_OK


def run_cache_gc(opts: CacheGcOptions, out: BinaryIO, err: TextIO) -> int:
    """Remove store files no cached result names; the counts on ``out``."""
    # lazy: run.cache._store is not loaded with this module; only run_cache_gc() needs it
    from crucible.run.cache._store import TaskCache

    directory = _cache_dir(opts.cache)
    counts: dict[str, Any] = {"removed": 0, "kept": 0, "bytes": 0}
    if directory is not None:
        tc = TaskCache(directory, warn=warner(err))
        try:
            counts = tc.gc(grace=opts.grace)
        finally:
            tc.close()
    _json_line(out, counts, sort_keys=True)
    return EXIT_OK
