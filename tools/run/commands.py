"""What each ``crucible-dispatch`` verb does, without click: an options dataclass in,
data on ``out``, messages for people on ``err``, an exit code back (run.md, cache.md).

The CLI (run/cli.py) only parses the command line into these dataclasses; the
streams are parameters so tests and the CLI pass their own.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from crucible.core.errors import EXIT_OK, InputRefused, UsageError
from crucible.run._options import RunOptions

__all__ = [
    "PROG",
    "CacheForgetOptions",
    "CacheGcOptions",
    "DispatchOptions",
    "ReportOptions",
    "dispatch_options",
    "run_cache_forget",
    "run_cache_gc",
    "run_report",
    "run_run",
    "summary_line",
]

PROG = "crucible-dispatch"


@dataclass(frozen=True)
class DispatchOptions:
    """``crucible-dispatch run``: the run's options and how the dry run prints."""

    run: RunOptions
    #: with ``--dry-run``: NDJSON lines on stdout instead of the table
    as_json: bool = False


@dataclass(frozen=True)
class ReportOptions:
    """``crucible-dispatch report``: the state dir and how to show it."""

    state: Path
    #: one task's instances instead of the task table
    task: str | None = None
    #: ``--html FILE|-``: the HTML timeline instead of the table
    html_file: str | None = None
    as_json: bool = False


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


def dispatch_options(*, as_json: bool, cache: Path | None, **fields: Any) -> DispatchOptions:
    """``run``'s options from its command line's values (parameter names as in
    run/_click_cli.py's ``run_cmd``; run/_argv.py gives the same)."""
    return DispatchOptions(RunOptions(cache=cache or None, **fields), as_json)


def _warn(err: TextIO) -> Any:
    def warn(message: str) -> None:
        err.write(f"{PROG}: warning: {message}\n")
        err.flush()

    return warn


def run_run(opts: DispatchOptions, out: BinaryIO, err: TextIO) -> int:
    """Run the plan; the dry run's lines or ``--outputs -`` on ``out``, the summary on
    ``err``. Refused and unusable options raise before the state dir is touched."""
    from crucible.run._runner import run_plan

    options = opts.run
    if opts.as_json and not options.dry_run:
        raise UsageError("--json goes with --dry-run (the events are --events -)")
    # the live line and followed output would overwrite each other
    progress = err.isatty() and not options.follow and not options.dry_run
    options = dataclasses.replace(options, progress=progress)
    if options.executor != "local" and not options.dry_run:
        from crucible.run._dask_executor import check_options

        check_options(options)  # before the state dir is touched
    if options.outputs == "-" and options.events == "-":
        raise UsageError("--outputs - and --events - cannot both use stdout")
    live: Any = None
    if options.progress:
        from crucible.run._progress import LiveProgress

        live = LiveProgress(err)
    try:
        outcome = run_plan(options, on_progress=live, on_warning=_warn(err))
    finally:
        if live is not None:
            live.close()
    if options.dry_run:
        _print_dry_run(outcome.plan_lines, opts.as_json, out)
        return int(outcome.exit_code)
    if options.outputs is not None:
        from crucible.run._outputs import copy_outputs

        copy_outputs(options.state, options.outputs, out)
    err.write(f"{PROG}: {summary_line(outcome, options.state)}\n")
    err.flush()
    return int(outcome.exit_code)


def summary_line(outcome: Any, state: Path) -> str:
    """The run's last line: its counts, and the first failed units with their logs."""
    c = outcome.counts
    if outcome.message is not None:
        head = f"{outcome.message} ({c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped)"
    else:
        head = (
            f"run {outcome.status}: {c['passed']} passed, {c['failed']} failed, "
            f"{c['skipped']} skipped in {outcome.duration:.2f}s"
        )
    if outcome.failures:
        shown = ", ".join(
            _printable(label) + (f" ({state / log})" if log else "")
            for label, log in outcome.failures
        )
        more = c["failed"] - len(outcome.failures)
        head += f"; failed: {shown}" + (f" and {more} more" if more > 0 else "")
    return head + f" (report: {PROG} report {state})"


def _printable(text: str) -> str:
    return "".join(ch if ch.isprintable() else f"\\x{ord(ch):02x}" for ch in text)


def _print_dry_run(lines: Any, as_json: bool, out: BinaryIO) -> None:
    from crucible.core import ndjson

    if as_json:
        for line in lines:
            out.write(ndjson.dumps_line(line))
        out.flush()
        return
    units = [
        _printable(line["task"] if "key" not in line else f"{line['task']}[{line['key']}]")
        for line in lines
    ]
    width = min(max((len(u) for u in units), default=0), 40)
    for line, unit in zip(lines, units, strict=True):
        out.write(f"{line['action']:<12} {unit:<{width}}  {line['reason']}\n".encode())
    out.flush()


def run_report(opts: ReportOptions, out: TextIO, err: TextIO) -> int:
    """The task table (or one task's instances), the NDJSON rows, or the HTML page.
    Text goes to ``out``, NDJSON to its byte stream ``out.buffer``."""
    from crucible.core import ndjson, output
    from crucible.run import _report as report

    state, task = opts.state, opts.task
    if not state.is_dir():
        raise InputRefused("no such state dir", where=str(state))
    rows = report.collect(state, task)
    if opts.html_file is not None:
        page = report.render_html(rows, title=f"crucible run {state}")
        if opts.html_file == "-":
            out.write(page)
        else:
            output.write_output(opts.html_file, page.encode("utf-8"))  # a device/FIFO: streamed
            err.write(f"{PROG}: wrote {opts.html_file}\n")
        return EXIT_OK
    if opts.as_json:
        instances = task is not None
        for r in rows:
            if r.key is None or instances:
                out.buffer.write(ndjson.dumps_line(report.row_json(r)))
        if rows.loop is not None:  # a scored loop: one more line, {"loop": ...}
            from crucible.run import _loop_view as loop_view

            out.buffer.write(ndjson.dumps_line({"loop": loop_view.to_json(rows.loop)}))
        return EXIT_OK
    report.render_table(rows, out, instances=task is not None)
    if task is None:
        report.render_outputs(state, out)
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


def _json_line(out: TextIO, value: dict[str, Any], *, sort_keys: bool = False) -> None:
    import json

    out.write(json.dumps(value, sort_keys=sort_keys, separators=(",", ":")) + "\n")
    out.flush()


def run_cache_forget(opts: CacheForgetOptions, out: TextIO, err: TextIO) -> int:
    """Drop every cached result of the task; ``{"forgotten": N, "task": T}`` on ``out``."""
    from crucible.run._cache import TaskCache
    from crucible.stage import escape_key

    directory = _cache_dir(opts.cache)
    n = 0
    if directory is not None:
        tc = TaskCache(directory, warn=_warn(err))
        try:
            n = tc.forget(opts.task, escape_key)
        finally:
            tc.close()
    _json_line(out, {"forgotten": n, "task": opts.task})
    return EXIT_OK


def run_cache_gc(opts: CacheGcOptions, out: TextIO, err: TextIO) -> int:
    """Remove store files no cached result names; the counts on ``out``."""
    from crucible.run._cache import TaskCache

    directory = _cache_dir(opts.cache)
    counts: dict[str, Any] = {"removed": 0, "kept": 0, "bytes": 0}
    if directory is not None:
        tc = TaskCache(directory, warn=_warn(err))
        try:
            counts = tc.gc(grace=opts.grace)
        finally:
            tc.close()
    _json_line(out, counts, sort_keys=True)
    return EXIT_OK
