"""What each ``crucible-dispatch`` verb does, without click: an options dataclass in,
data on ``out``, messages for people on ``err``, an exit code back (run.md, cache.md).

The CLI (run/_click_cli.py, and run/_argv.py for a plain run) only parses the
command line into these dataclasses; the streams are parameters so tests and
the CLI pass their own. Run's verb is here; report's and cache's are in
run/_commands_state.py, re-exported here and loaded on first use.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

from crucible.core.errors import UsageError
from crucible.run._options import RunOptions

if TYPE_CHECKING:
    from crucible.run._commands_state import (
        CacheForgetOptions,
        CacheGcOptions,
        ReportOptions,
        run_cache_forget,
        run_cache_gc,
        run_report,
    )

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

#: the report and cache verbs, in run/_commands_state.py: loaded on first use,
#: so a run does not build their options (~1 ms of every dispatch's start-up)
_STATE_VERBS = (
    "CacheForgetOptions",
    "CacheGcOptions",
    "ReportOptions",
    "run_cache_forget",
    "run_cache_gc",
    "run_report",
)


def __getattr__(name: str) -> Any:
    if name in _STATE_VERBS:
        from crucible.run import _commands_state

        return getattr(_commands_state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class DispatchOptions:
    """``crucible-dispatch run``: the run's options and how the dry run prints."""

    run: RunOptions
    #: with ``--dry-run``: NDJSON lines on stdout instead of the table
    as_json: bool = False


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
    if options.executor == "slurm" and not options.dry_run:
        from crucible.run._slurm_executor import check_options as check_slurm

        check_slurm(options)  # before the state dir is touched
    elif options.executor != "local" and not options.dry_run:
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
