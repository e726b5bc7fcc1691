"""The run's output flags, checked before the state dir is claimed (issue 27 item 12).

``--outputs``, ``--events`` and ``--publish-dir`` name places the run writes at
its end (or all along): each one that could only fail then is refused now, as
a usage error (exit 2) naming the flag and the path, with nothing written. A
``--outputs`` FIFO is opened here (without waiting) and held until the run
writes through it, so a reader waiting on it now is the one that gets the
results; one with no reader is refused. docs/spec/run.md, "Admission".
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from crucible.core.errors import OperationalError, UsageError
from crucible.run._options import RunOptions

__all__ = ["check_output_flags", "open_outputs_stream"]


def check_output_flags(options: RunOptions) -> None:
    """Refuse an output flag the run could not honour (see module doc)."""
    if options.scheduler is not None and options.executor != "dask":
        raise UsageError(
            "--scheduler names the cluster of --executor dask; pass --executor dask too",
            where="--scheduler",
        )
    state = os.path.realpath(options.state)
    for flag, value in (("--outputs", options.outputs), ("--events", options.events)):
        if value is not None and value != "-":
            _refuse_inside_state(flag, value, state)
    if options.outputs is not None and options.outputs != "-":
        _check_file_target("--outputs", options.outputs)
    if options.publish_dir is not None:
        _check_publish_dir(options.publish_dir)


def _refuse_inside_state(flag: str, value: str, state: str) -> None:
    """A file of the state dir is the run's own (``plan.json``, the session log):
    a copy written over it would corrupt the run (or mirror the log into itself)."""
    target = os.path.realpath(value)
    if target == state or target.startswith(state.rstrip("/") + "/"):
        raise UsageError(
            f"{flag} names a file in the state dir ({state}), which holds the run's own "
            "files: write it elsewhere",
            where=value,
        )


def _check_file_target(flag: str, value: str) -> None:
    """What ``crucible.core.output.write_output`` would refuse at the end."""
    try:
        st = os.stat(value)  # follows links: what the name leads to decides
    except FileNotFoundError:
        if os.path.islink(value):
            raise UsageError(
                f"{flag}: a dangling symbolic link; links to nothing are not followed",
                where=value,
            ) from None
        parent = os.path.dirname(os.path.abspath(value))
        if not os.path.isdir(parent):
            raise UsageError(f"{flag}: no such directory: {parent}", where=value) from None
        return
    except OSError as exc:
        raise UsageError(f"{flag}: cannot use it: {exc.strerror or exc}", where=value) from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{flag}: is a directory, not a file", where=value)
    if stat.S_ISBLK(st.st_mode):
        raise UsageError(f"{flag}: is a block device; write to a file or a stream", where=value)


def _check_publish_dir(path: Path) -> None:
    if os.path.lexists(path) and not os.path.isdir(path):
        what = "a dangling symbolic link" if not os.path.exists(path) else "not a directory"
        raise UsageError(f"--publish-dir: {what}", where=str(path))


def open_outputs_stream(value: str | None) -> int | None:
    """``--outputs`` naming a FIFO: its write end, opened without waiting and held
    until the run writes the results through it; a FIFO with no reader is
    refused now. None for anything else (a file is replaced at the end)."""
    if value is None or value == "-":
        return None
    try:
        if not stat.S_ISFIFO(os.stat(value).st_mode):
            return None
    except OSError:
        return None
    try:
        fd = os.open(value, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        if exc.errno == errno.ENXIO:
            raise UsageError(
                "--outputs: a FIFO with no reader; nothing would read the results", where=value
            ) from None
        raise OperationalError(f"--outputs: cannot open: {exc.strerror}", where=value) from None
    os.set_blocking(fd, True)  # a reader exists: write as any writer does
    return fd
