"""Run a command with its output passed through live and captured (a tee), and
turn what happened into an :class:`~crucible.ledger._ledger.Outcome`.

Settled (recorded): exit 0, or an exit code the caller declared deterministic.
Never recorded: other exit codes, death by a signal, our own interruption, or
output too large to record.
"""

from __future__ import annotations

import base64
import contextlib
import os
import selectors
import signal
import subprocess
from collections.abc import Collection, Sequence
from types import FrameType
from typing import IO, Any

from crucible.core.errors import OperationalError, StartFailed
from crucible.core.output import write_stream
from crucible.core.structs import dataclass
from crucible.ledger._ledger import Outcome

__all__ = [
    "CAPTURE_LIMIT",
    "CannotStart",
    "CommandResult",
    "command_outcome",
    "decode_streams",
    "run_command",
]

#: captured stdout + stderr above this is passed through but not recorded
CAPTURE_LIMIT = 64 * 1024 * 1024
_FORWARDED: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class CannotStart(StartFailed):
    """The command could not be started; ``usage`` is True when the argv names
    nothing runnable (not found, not executable: exit 2), False for other OS
    errors (exit 3). In the error tree, so the command edge maps it like any other."""


@dataclass(frozen=True)
class CommandResult:
    #: the exit code, or None when killed by a signal
    exit_code: int | None
    #: the signal that ended the command, if any
    signal: int | None
    stdout: bytes
    stderr: bytes
    #: output exceeded the capture limit (the captured bytes are incomplete)
    overflow: bool
    #: the signal we received (and forwarded) while the command ran, if any
    interrupted_by: int | None
    #: why the live copy of a stream failed (not a closed reader), if it did
    output_error: str | None = None

    @property
    def shell_status(self) -> int:
        """The status a shell would report: the code, or 128 + signal."""
        if self.interrupted_by is not None and self.exit_code in (None, 0):
            return 128 + self.interrupted_by
        if self.exit_code is None:
            return 128 + (self.signal or 0)
        return self.exit_code


def _pass_through(
    out: IO[bytes] | None, chunk: bytes, errors: list[str], name: str
) -> IO[bytes] | None:
    """Write ``chunk`` live; a closed reader stops the pass-through, not the capture.
    Any other write failure (a full disk under ``> f``, EIO) also stops it but is
    kept in ``errors``: the caller must not exit 0 over output that never landed."""
    if out is None:
        return None
    try:
        write_stream(out, chunk)  # a short write raises, never truncates silently
    except (BrokenPipeError, ValueError):
        return None
    except OperationalError as exc:
        errors.append(f"cannot write the command's {name}: {exc.message}")
        return None
    return out


def run_command(
    argv: Sequence[str],
    *,
    stdout: IO[bytes],
    stderr: IO[bytes],
    limit: int = CAPTURE_LIMIT,
) -> CommandResult:
    """Run ``argv`` (stdin inherited), copying its stdout and stderr live to
    ``stdout``/``stderr`` while capturing them. SIGINT, SIGTERM and SIGHUP received
    meanwhile are forwarded to the command."""
    received: list[int] = []
    started: list[subprocess.Popen[bytes]] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        for child in started:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    # The handlers go in before the command starts: a signal arriving between its
    # start and their installation would kill us and leave the command running,
    # holding our caller's pipes open (seen under load).
    previous: dict[int, Any] = {}
    with contextlib.suppress(ValueError):  # not the main thread: cannot install handlers
        for sig in _FORWARDED:
            previous[sig] = signal.signal(sig, forward)
    proc = _start(argv, previous)
    started.append(proc)
    for signum in received[:1]:  # arrived while it was starting: it gets it now
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)
    try:
        captured, overflow, errors = _pump(proc, stdout, stderr, limit)
        code = proc.wait()
    finally:
        _restore(previous)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return CommandResult(
        exit_code=code if code >= 0 else None,
        signal=-code if code < 0 else None,
        stdout=bytes(captured[1]),
        stderr=bytes(captured[2]),
        overflow=overflow,
        interrupted_by=received[0] if received else None,
        output_error=errors[0] if errors else None,
    )


def _restore(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _start(argv: Sequence[str], previous: dict[int, Any]) -> subprocess.Popen[bytes]:
    """The command started with both outputs on pipes; a failure to start restores
    the signal handlers and is a CannotStart (exit 2 when nothing runnable is named)."""
    try:
        return subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except BaseException as exc:
        _restore(previous)
        unrunnable = (FileNotFoundError, PermissionError, NotADirectoryError, IsADirectoryError)
        if isinstance(exc, unrunnable):
            raise CannotStart(f"cannot start {argv[0]!r}: {exc.strerror}", usage=True) from None
        if isinstance(exc, OSError):
            usage = exc.errno == 8  # ENOEXEC: not an executable format
            raise CannotStart(
                f"cannot start {argv[0]!r}: {exc.strerror or exc}", usage=usage
            ) from None
        raise


def _pump(
    proc: subprocess.Popen[bytes], stdout: IO[bytes], stderr: IO[bytes], limit: int
) -> tuple[dict[int, bytearray], bool, list[str]]:
    """Copy the command's outputs live to ``stdout``/``stderr`` until both close,
    capturing up to ``limit`` bytes in all: (captured by fd, overflowed, the
    errors of our own streams)."""
    captured = {1: bytearray(), 2: bytearray()}
    sinks: dict[int, IO[bytes] | None] = {1: stdout, 2: stderr}
    names = {1: "stdout", 2: "stderr"}
    errors: list[str] = []
    total = 0
    overflow = False
    assert proc.stdout is not None and proc.stderr is not None
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ, 1)
        selector.register(proc.stderr, selectors.EVENT_READ, 2)
        while selector.get_map():
            for key, _ in selector.select():
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                stream: int = key.data
                sinks[stream] = _pass_through(sinks[stream], chunk, errors, names[stream])
                if not overflow:
                    total += len(chunk)
                    if total > limit:
                        overflow = True
                        captured[1].clear()
                        captured[2].clear()
                    else:
                        captured[stream] += chunk
                if overflow and sinks[stream] is None:
                    # Nobody reads this stream and nothing will be recorded: close
                    # it, so the command gets SIGPIPE as it would writing to the
                    # closed reader itself (`run -- yes | head` must end).
                    selector.unregister(key.fileobj)
                    key.fileobj.close()  # type: ignore[union-attr]
    return captured, overflow, errors


def _encode_stream(name: str, data: bytes, value: dict[str, Any]) -> None:
    try:
        value[name] = data.decode("utf-8")
    except UnicodeDecodeError:
        value[f"{name}_base64"] = base64.b64encode(data).decode("ascii")


def command_outcome(result: CommandResult, record_exits: Collection[int]) -> Outcome:
    """The value ``{"exit": N, "stdout": ..., "stderr": ...}`` (a stream that is not
    UTF-8 is stored as ``<stream>_base64``), settled only when it is a fact."""
    value: dict[str, Any] = {"exit": result.shell_status}
    _encode_stream("stdout", result.stdout, value)
    _encode_stream("stderr", result.stderr, value)
    status = "ok" if result.exit_code == 0 else "failed"
    settled = (
        result.interrupted_by is None
        and not result.overflow
        and result.exit_code is not None
        and (result.exit_code == 0 or result.exit_code in record_exits)
    )
    return Outcome(value, status, settled)


def decode_streams(value: Any) -> tuple[int, bytes, bytes] | None:
    """(exit, stdout, stderr) of a recorded command value, or None if malformed."""
    if not isinstance(value, dict) or type(value.get("exit")) is not int:
        return None
    if not 0 <= value["exit"] <= 255:
        return None
    streams: list[bytes] = []
    for name in ("stdout", "stderr"):
        text = value.get(name)
        if isinstance(text, str):
            streams.append(text.encode("utf-8"))
            continue
        raw = value.get(f"{name}_base64")
        if not isinstance(raw, str):
            return None
        try:
            streams.append(base64.b64decode(raw, validate=True))
        except ValueError:
            return None
    return value["exit"], streams[0], streams[1]
