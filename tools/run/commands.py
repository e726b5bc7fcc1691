"""What each ``crucible-dispatch`` verb does, without click: an options dataclass in,
data on ``out``, messages for people on ``err``, an exit code back (run.md, cache.md).

The CLI (run/_click_cli.py, and run/_argv.py for a plain run) only parses the
command line into these dataclasses; the streams are parameters so tests and
the CLI pass their own. Run's verb is here; report's and cache's are in
run/_commands_state.py, re-exported here and loaded on first use.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TextIO

from crucible.core import structs
from crucible.core.errors import UsageError
from crucible.core.structs import dataclass
from crucible.run._edge import PROG, warner
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
        # lazy: run._commands_state is not loaded with this module; only __getattr__() needs it
        from crucible.run import _commands_state

        return getattr(_commands_state, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class DispatchOptions:
    """``crucible-dispatch run``: the run's options and how the dry run prints."""

    run: RunOptions
    #: with ``--dry-run``: NDJSON lines on stdout instead of the table
    as_json: bool = False
    #: ``--all``: the table lists every unit, not only those that will run
    show_all: bool = False


def dispatch_options(
    *, as_json: bool, cache: Path | None, show_all: bool = False, **fields: Any
) -> DispatchOptions:
    """``run``'s options from its command line's values (parameter names as in
    run/_click_cli.py's ``run_cmd``; run/_argv.py gives the same)."""
    return DispatchOptions(RunOptions(cache=cache or None, **fields), as_json, show_all)


def run_run(opts: DispatchOptions, out: BinaryIO, err: TextIO) -> int:
    """Run the plan; the dry run's lines or ``--outputs -`` on ``out``, the summary on
    ``err``. Refused and unusable options raise before the state dir is touched."""
    # lazy: run.session._runner is not loaded with this module; only run_run() needs it
    from crucible.run.session._runner import run_plan

    options = opts.run
    if opts.as_json and not options.dry_run:
        raise UsageError("--json goes with --dry-run (the events are --events -)")
    if opts.show_all and not options.dry_run:
        raise UsageError("--all goes with --dry-run (it lists every unit)")
    # the live line and followed output would overwrite each other
    progress = err.isatty() and not options.follow and not options.dry_run
    options = structs.replace(options, progress=progress)
    if options.executor == "slurm" and not options.dry_run:
        # lazy: only run_run() needs it (start-up)
        from crucible.run.executors.slurm._executor import check_options as check_slurm

        check_slurm(options)  # before the state dir is touched
    elif options.executor != "local" and not options.dry_run:
        # lazy: run.executors.dask._executor is not loaded with this module; only run_run() needs it
        from crucible.run.executors.dask._executor import check_options

        check_options(options)  # before the state dir is touched
    if options.actor is not None:
        # lazy: run.accounting._forms is not loaded with this module; only run_run() needs it
        from crucible.run.accounting._forms import check_actor

        check_actor(options.actor)  # before the state dir is touched
    if options.outputs == "-" and options.events == "-":
        raise UsageError("--outputs - and --events - cannot both use stdout")
    live: Any = None
    if options.progress:
        # lazy: run.engine._progress is not loaded with this module; only run_run() needs it
        from crucible.run.engine._progress import LiveProgress

        live = LiveProgress(err)
    warn = warner(err)
    try:
        outcome = run_plan(options, on_progress=live, on_warning=warn)
    finally:
        if live is not None:
            live.close()
        if options.follow:
            # lazy: run.session._mirror is not loaded with this module; only run_run() needs it
            from crucible.run.session._mirror import STALL, follow_dropped

            if follow_dropped():
                warn(
                    f"--follow: stderr's reader took nothing for {STALL:g} s; the stream was "
                    "dropped, the tasks' output is complete in their logs"
                )
    if options.dry_run:
        _print_dry_run(outcome.plan_lines, opts.as_json, opts.show_all, out)
        return int(outcome.exit_code)
    if options.outputs == "-":  # a FILE was written by the run (crucible.run.session._runner)
        _copy_outputs(options, out)
    err.write(f"{PROG}: {summary_line(outcome, options.state)}\n")
    err.flush()
    return int(outcome.exit_code)


def _copy_outputs(options: RunOptions, out: BinaryIO) -> None:
    """``--outputs``: STATE/outputs.json to stdout or FILE. A stdout whose reader
    has left (``| head -c 0``) only loses the copy: the run's own exit code and
    last line stand, as with ``--events -`` (issue 27 item 13)."""

    # lazy: run.session._outputs is not loaded with this module; only _copy_outputs() needs it
    from crucible.run.session._outputs import copy_outputs

    try:
        copy_outputs(options.state, "-", out)
    except BrokenPipeError:
        # nothing more reaches the closed pipe, not even the flush at exit
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, out.fileno())
        finally:
            os.close(null)


def _counts_text(c: Any) -> str:
    """``3 passed, 2 failed, 1 skipped``; failures the plan tolerated are
    counted apart: ``2 failed (tolerated)``, or ``5 failed (2 tolerated)``."""
    failed = f"{c['failed']} failed"
    tolerated = int(c.get("tolerated", 0))
    if tolerated:
        failed += " (tolerated)" if tolerated >= c["failed"] else f" ({tolerated} tolerated)"
    return f"{c['passed']} passed, {failed}, {c['skipped']} skipped"


def summary_line(outcome: Any, state: Path) -> str:
    """The run's last line: its counts, and the first failed units with their logs."""
    c = outcome.counts
    if outcome.message is not None:
        head = f"{outcome.message} ({_counts_text(c)})"
    else:
        head = f"run {outcome.status}: {_counts_text(c)} in {outcome.duration:.2f}s"
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


def _print_dry_run(lines: Any, as_json: bool, show_all: bool, out: BinaryIO) -> None:
    # lazy: core.ndjson is not loaded with this module; only _print_dry_run() needs it
    from crucible.core import ndjson

    if as_json:
        for line in lines:
            out.write(ndjson.dumps_line(line))
        out.flush()
        return
    # lazy: run.report._dry_text is not loaded with this module; only _print_dry_run() needs it
    from crucible.run.report._dry_text import dry_run_text

    for text in dry_run_text(list(lines), show_all=show_all, printable=_printable):
        out.write(f"{text}\n".encode())
    out.flush()
